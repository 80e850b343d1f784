package cowfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
)

// Numbered failpoints of the commit protocol, in the order a commit
// passes them. failpointHook is nil outside tests; the crash tests set it
// in a re-executed test binary to SIGKILL the process at one of them.
const (
	fpValidated      = iota + 1 // conflicts checked, previous bytes saved
	fpWALTemp                   // wal.tmp written and fsynced
	fpWALRenamed                // wal in place (the commit point), directory not yet fsynced
	fpWALSynced                 // wal durable
	fpApplyRemoved              // one entry moved aside and checked (hit once per removal)
	fpApplyTemp                 // one temp file written (hit once per write)
	fpApplyRenamed              // one file or symlink published (hit once per write or symlink)
	fpApplied                   // every change applied and durable
	fpAfterWritten              // after-images written, the entries moved aside not yet removed
	fpDone                      // transaction moved into the undo journal
	fpApplyMkdir                // a new directory made under its temp name with its mode, not renamed
	fpApplySynced               // every new file written and durable, none published
	fpApplyExchanged            // one file exchanged with its target, the displaced one not yet checked
	fpCleaned                   // after-images written, the entries moved aside removed, not yet done
	fpApplyChecked              // one target checked once more, right before it is exchanged
	numFailpoints    = fpApplyChecked
)

// Failpoints of staging, numbered apart from the commit protocol's.
const (
	fpStageBlob      = 101 // the staged bytes are stored, the log record is not appended
	fpStageAppended  = 102 // the log record is appended and fsynced (also ends a batch)
	fpBatchPacked    = 103 // a batch's pack file is durable, no record appended
	fpBatchTorn      = 104 // all but the last record of a batch written, not fsynced
	fpStageLogSynced = 105 // the log record is durable, its seal not yet updated
	fpBatchStreamed  = 106 // a streamed op's temp blob is durable, not yet named
)

var failpointHook func(fp int)

func failpoint(fp int) {
	if failpointHook != nil {
		failpointHook(fp)
	}
}

// FailpointEnv names the environment variable that makes a process using
// cowfs kill itself (SIGKILL) at a named step of a commit or a staging
// call, so that crash tests outside the package (a CLI, another
// language's harness) can stop it anywhere: "NAME" or "NAME:N" for the
// N-th time the step is reached (1 by default). The names are those of
// FailpointNames. An unknown name stops the process at start-up rather
// than let a crash test pass without crashing.
const FailpointEnv = "PULSE_COWFS_FAILPOINT"

// FailpointNames lists the steps FailpointEnv can name, in protocol
// order, with the failpoint number the package documentation uses.
var FailpointNames = []struct {
	Name   string
	Number int
}{
	{"validated", fpValidated}, {"wal-temp", fpWALTemp}, {"wal-renamed", fpWALRenamed}, {"wal-synced", fpWALSynced},
	{"apply-removed", fpApplyRemoved}, {"apply-mkdir", fpApplyMkdir}, {"apply-temp", fpApplyTemp},
	{"apply-synced", fpApplySynced}, {"apply-checked", fpApplyChecked}, {"apply-exchanged", fpApplyExchanged},
	{"apply-renamed", fpApplyRenamed}, {"applied", fpApplied}, {"after-written", fpAfterWritten},
	{"cleaned", fpCleaned}, {"done", fpDone},
	{"stage-blob", fpStageBlob}, {"stage-appended", fpStageAppended}, {"batch-packed", fpBatchPacked}, {"batch-torn", fpBatchTorn},
	{"stage-log-synced", fpStageLogSynced}, {"batch-streamed", fpBatchStreamed},
}

func init() {
	v := os.Getenv(FailpointEnv)
	if v == "" {
		return
	}
	name, hitStr, _ := strings.Cut(v, ":")
	hit := 1
	if hitStr != "" {
		n, err := strconv.Atoi(hitStr)
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "cowfs: %s=%q: bad hit count\n", FailpointEnv, v)
			os.Exit(2)
		}
		hit = n
	}
	fp := 0
	for _, n := range FailpointNames {
		if n.Name == name {
			fp = n.Number
		}
	}
	if fp == 0 {
		fmt.Fprintf(os.Stderr, "cowfs: %s=%q: no such failpoint\n", FailpointEnv, v)
		os.Exit(2)
	}
	var seen atomic.Int64
	failpointHook = func(n int) {
		if n == fp && seen.Add(1) == int64(hit) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
}
