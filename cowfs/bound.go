package cowfs

// BoundsOpenTransactions reports whether Begin may refuse a transaction for
// the WithMaxOpenTransactions bound. A caller that begins a transaction
// only once it has something to stage (the sandbox, after the command)
// begins before the work instead when it is bounded, so that work it
// could not stage is refused before it is done.
func (f *FS) BoundsOpenTransactions() bool { return f.opts.maxOpenTx > 0 }
