package cowfs

// The line diff behind Tx.Diff: git's histogram diff (xdiff/xhistogram.c),
// with git's fallback to Myers' algorithm (xdiff/xdiffi.c, the same cost
// bound) where every common line of a region repeats too often for a
// histogram to find an anchor, and git's sliding of change groups
// (xdl_change_compact, without the indent heuristic). Following git
// closely is the point: reviewers compare it with `git diff --histogram`,
// and its size must stay within a few percent of git's on repetitive
// input as on ordinary code, which a matcher with junk heuristics (or
// patience diff alone, which has no anchor in a file of repeated lines)
// does not manage.

// opCode is one step of the edit script turning a into b: 'e' means
// a[I1:I2] equals b[J1:J2], 'd' deletes a[I1:I2], 'i' inserts b[J1:J2],
// 'r' replaces a[I1:I2] with b[J1:J2].
type opCode struct {
	Tag            byte
	I1, I2, J1, J2 int
}

// maxChainLength is git's: a line occurring more often than this in a
// region is never an anchor of the histogram; a region whose common lines
// all do is left to Myers' algorithm.
const maxChainLength = 64

// Myers' algorithm's heuristics, git's values (xdiff/xdiffi.c).
const (
	myersMaxCostMin = 256 // least cost bound, whatever the size
	myersHeurMin    = 256 // cost from which a good snake may end the search
	myersSnakeCnt   = 20  // a "good" snake is longer than this
	myersKHeur      = 4
)

// lineDiff returns the opcodes turning a into b, contiguous and covering
// both sides.
func lineDiff(a, b []string) []opCode {
	d := newLineDiffer(a, b)
	// No common prefix and suffix are set aside first: git's histogram
	// does not, and on files of few distinct lines doing so moves the
	// anchors and can lengthen the diff.
	d.histogram(0, len(d.a), 0, len(d.b))
	compact(d.a, d.ca, d.cb)
	compact(d.b, d.cb, d.ca)
	return editScript(d.ca, d.cb)
}

// lineDiffer holds both sides as line ids (equal lines, equal ids) and
// which lines are changed.
type lineDiffer struct {
	a, b   []int32
	ca, cb []bool
	// Histogram index over the current region of a, by line id: the
	// last occurrence scanned (head), the number of occurrences (cnt);
	// by line of a, the next occurrence of the same line (next). Only
	// the ids in touched are non-zero between uses.
	head, cnt []int32
	next      []int32
	touched   []int32
	inB       []bool // by line id, for the Myers fallback
}

func newLineDiffer(a, b []string) *lineDiffer {
	ids := make(map[string]int32, len(a))
	d := &lineDiffer{a: make([]int32, len(a)), b: make([]int32, len(b)), ca: make([]bool, len(a)), cb: make([]bool, len(b))}
	for i, l := range a {
		id, ok := ids[l]
		if !ok {
			id = int32(len(ids))
			ids[l] = id
		}
		d.a[i] = id
	}
	for j, l := range b {
		id, ok := ids[l]
		if !ok {
			id = int32(len(ids))
			ids[l] = id
		}
		d.b[j] = id
	}
	d.head = make([]int32, len(ids))
	d.cnt = make([]int32, len(ids))
	d.next = make([]int32, len(a))
	return d
}

// region is an inclusive range of lines on each side, as git's.
type region struct{ begin1, end1, begin2, end2 int }

// histogram marks the changed lines of a[a1:a2] against b[b1:b2].
func (d *lineDiffer) histogram(a1, a2, b1, b2 int) {
	for {
		if a1 == a2 {
			markChanged(d.cb[b1:b2])
			return
		}
		if b1 == b2 {
			markChanged(d.ca[a1:a2])
			return
		}
		lcs, found, fallback := d.findLCS(a1, a2, b1, b2)
		switch {
		case fallback:
			d.myersRegion(a1, a2, b1, b2)
			return
		case !found:
			markChanged(d.ca[a1:a2])
			markChanged(d.cb[b1:b2])
			return
		}
		d.histogram(a1, lcs.begin1, b1, lcs.begin2)
		a1, b1 = lcs.end1+1, lcs.end2+1
	}
}

func markChanged(c []bool) {
	for i := range c {
		c[i] = true
	}
}

// findLCS is git's find_lcs: the longest run of common lines whose rarest
// line occurs least often in a[a1:a2]. fallback reports a region whose
// common lines all occur more than maxChainLength times.
func (d *lineDiffer) findLCS(a1, a2, b1, b2 int) (lcs region, found, fallback bool) {
	for i := a2 - 1; i >= a1; i-- {
		id := d.a[i]
		if d.cnt[id] == 0 {
			d.touched = append(d.touched, id)
			d.next[i] = -1
		} else {
			d.next[i] = d.head[id]
		}
		d.head[id] = int32(i)
		d.cnt[id]++
	}
	defer func() {
		for _, id := range d.touched {
			d.cnt[id] = 0
		}
		d.touched = d.touched[:0]
	}()
	best := int32(maxChainLength + 1)
	hasCommon := false
	for bp := b1; bp < b2; {
		id := d.b[bp]
		c := d.cnt[id]
		bNext := bp + 1
		switch {
		case c == 0:
		case c > best:
			hasCommon = true
		default:
			hasCommon = true
			for as := int(d.head[id]); ; {
				np := int(d.next[as])
				bs, ae, be, rc := bp, as, bp, c
				for a1 < as && b1 < bs && d.a[as-1] == d.b[bs-1] {
					as--
					bs--
					if rc > 1 {
						rc = min(rc, d.cnt[d.a[as]])
					}
				}
				for ae < a2-1 && be < b2-1 && d.a[ae+1] == d.b[be+1] {
					ae++
					be++
					if rc > 1 {
						rc = min(rc, d.cnt[d.a[ae]])
					}
				}
				if bNext <= be {
					bNext = be + 1
				}
				if lcs.end1-lcs.begin1 < ae-as || rc < best {
					lcs = region{as, ae, bs, be}
					best = rc
				}
				// The next occurrence of the line past the run just
				// measured.
				for np >= 0 && np <= ae {
					np = int(d.next[np])
				}
				if np < 0 {
					break
				}
				as = np
			}
		}
		bp = bNext
	}
	if best <= maxChainLength {
		return lcs, true, false
	}
	return region{}, false, hasCommon
}

// myersRegion marks the changed lines of a[a1:a2] against b[b1:b2] with
// Myers' algorithm, as git's fallback does: lines without any match on
// the other side are changed for certain and left out of the search.
func (d *lineDiffer) myersRegion(a1, a2, b1, b2 int) {
	for i := a1; i < a2; i++ {
		if d.cnt[d.a[i]] == 0 {
			d.touched = append(d.touched, d.a[i])
		}
		d.cnt[d.a[i]]++
	}
	if d.inB == nil {
		d.inB = make([]bool, len(d.cnt))
	}
	inB := d.inB
	for j := b1; j < b2; j++ {
		if d.cnt[d.b[j]] > 0 {
			inB[d.b[j]] = true
		}
	}
	var ra, rb []int32 // the lines kept
	var ia, ib []int   // their places in a and b
	for i := a1; i < a2; i++ {
		if inB[d.a[i]] {
			ra, ia = append(ra, d.a[i]), append(ia, i)
		} else {
			d.ca[i] = true
		}
	}
	for j := b1; j < b2; j++ {
		if d.cnt[d.b[j]] > 0 {
			rb, ib = append(rb, d.b[j]), append(ib, j)
		} else {
			d.cb[j] = true
		}
	}
	for _, id := range d.touched {
		d.cnt[id], inB[id] = 0, false
	}
	d.touched = d.touched[:0]
	m := newMyers(ra, rb)
	m.compare(0, len(ra), 0, len(rb), false)
	for k, ch := range m.ca {
		if ch {
			d.ca[ia[k]] = true
		}
	}
	for k, ch := range m.cb {
		if ch {
			d.cb[ib[k]] = true
		}
	}
}

// myers is git's xdl_recs_cmp / xdl_split: divide and conquer on the
// middle snake, with a cost bound past which it splits at the furthest
// reaching path instead (so the time stays near O(N·sqrt N) whatever the
// input, at the price of a longer diff on pathological input only).
type myers struct {
	a, b   []int32
	ca, cb []bool
	kf, kb []int // furthest reaching paths by diagonal, forward and backward
	off    int   // index of diagonal 0 in kf and kb
	mxcost int
}

func newMyers(a, b []int32) *myers {
	ndiags := len(a) + len(b) + 3
	mx := 1 // git's xdl_bogosqrt
	for n := ndiags; n > 0; n >>= 2 {
		mx <<= 1
	}
	return &myers{
		a: a, b: b, ca: make([]bool, len(a)), cb: make([]bool, len(b)),
		kf: make([]int, ndiags), kb: make([]int, ndiags), off: len(b) + 1,
		mxcost: max(mx, myersMaxCostMin),
	}
}

func (m *myers) compare(off1, lim1, off2, lim2 int, needMin bool) {
	for off1 < lim1 && off2 < lim2 && m.a[off1] == m.b[off2] {
		off1++
		off2++
	}
	for off1 < lim1 && off2 < lim2 && m.a[lim1-1] == m.b[lim2-1] {
		lim1--
		lim2--
	}
	switch {
	case off1 == lim1:
		markChanged(m.cb[off2:lim2])
	case off2 == lim2:
		markChanged(m.ca[off1:lim1])
	default:
		i1, i2, minLo, minHi := m.split(off1, lim1, off2, lim2, needMin)
		m.compare(off1, i1, off2, i2, minLo)
		m.compare(i1, lim1, i2, lim2, minHi)
	}
}

// split returns where to divide the box (off1, off2)-(lim1, lim2), and
// whether each half must be diffed minimally (git's xdl_split).
func (m *myers) split(off1, lim1, off2, lim2 int, needMin bool) (s1, s2 int, minLo, minHi bool) {
	a, b, kf, kb, o := m.a, m.b, m.kf, m.kb, m.off
	const lineMax = int(^uint(0) >> 1)
	dmin, dmax := off1-lim2, lim1-off2
	fmid, bmid := off1-off2, lim1-lim2
	odd := (fmid-bmid)&1 != 0
	fmin, fmax, bmin, bmax := fmid, fmid, bmid, bmid
	kf[fmid+o] = off1
	kb[bmid+o] = lim1
	for ec := 1; ; ec++ {
		gotSnake := false
		// Widen the diagonals by one each way, or narrow at the box's
		// edge; the outer values are sentinels the loop reads.
		if fmin > dmin {
			fmin--
			kf[fmin-1+o] = -1
		} else {
			fmin++
		}
		if fmax < dmax {
			fmax++
			kf[fmax+1+o] = -1
		} else {
			fmax--
		}
		for d := fmax; d >= fmin; d -= 2 {
			var i1 int
			if kf[d-1+o] >= kf[d+1+o] {
				i1 = kf[d-1+o] + 1
			} else {
				i1 = kf[d+1+o]
			}
			prev := i1
			i2 := i1 - d
			for i1 < lim1 && i2 < lim2 && a[i1] == b[i2] {
				i1++
				i2++
			}
			if i1-prev > myersSnakeCnt {
				gotSnake = true
			}
			kf[d+o] = i1
			if odd && bmin <= d && d <= bmax && kb[d+o] <= i1 {
				return i1, i2, true, true
			}
		}
		if bmin > dmin {
			bmin--
			kb[bmin-1+o] = lineMax
		} else {
			bmin++
		}
		if bmax < dmax {
			bmax++
			kb[bmax+1+o] = lineMax
		} else {
			bmax--
		}
		for d := bmax; d >= bmin; d -= 2 {
			var i1 int
			if kb[d-1+o] < kb[d+1+o] {
				i1 = kb[d-1+o]
			} else {
				i1 = kb[d+1+o] - 1
			}
			prev := i1
			i2 := i1 - d
			for i1 > off1 && i2 > off2 && a[i1-1] == b[i2-1] {
				i1--
				i2--
			}
			if prev-i1 > myersSnakeCnt {
				gotSnake = true
			}
			kb[d+o] = i1
			if !odd && fmin <= d && d <= fmax && i1 <= kf[d+o] {
				return i1, i2, true, true
			}
		}
		if needMin {
			continue
		}
		// Past the trigger cost, a diagonal far along and ending in a
		// long snake is taken as good enough.
		if gotSnake && ec > myersHeurMin {
			best := 0
			for d := fmax; d >= fmin; d -= 2 {
				dd := d - fmid
				if dd < 0 {
					dd = -dd
				}
				i1 := kf[d+o]
				i2 := i1 - d
				v := (i1 - off1) + (i2 - off2) - dd
				if v > myersKHeur*ec && v > best &&
					off1+myersSnakeCnt <= i1 && i1 < lim1 &&
					off2+myersSnakeCnt <= i2 && i2 < lim2 {
					for k := 1; a[i1-k] == b[i2-k]; k++ {
						if k == myersSnakeCnt {
							best, s1, s2 = v, i1, i2
							break
						}
					}
				}
			}
			if best > 0 {
				return s1, s2, true, false
			}
			for d := bmax; d >= bmin; d -= 2 {
				dd := d - bmid
				if dd < 0 {
					dd = -dd
				}
				i1 := kb[d+o]
				i2 := i1 - d
				v := (lim1 - i1) + (lim2 - i2) - dd
				if v > myersKHeur*ec && v > best &&
					off1 < i1 && i1 <= lim1-myersSnakeCnt &&
					off2 < i2 && i2 <= lim2-myersSnakeCnt {
					for k := 0; a[i1+k] == b[i2+k]; k++ {
						if k == myersSnakeCnt-1 {
							best, s1, s2 = v, i1, i2
							break
						}
					}
				}
			}
			if best > 0 {
				return s1, s2, false, true
			}
		}
		// Enough: split at the furthest reaching path.
		if ec >= m.mxcost {
			fbest, fbest1 := -1, -1
			for d := fmax; d >= fmin; d -= 2 {
				i1 := min(kf[d+o], lim1)
				i2 := i1 - d
				if lim2 < i2 {
					i1, i2 = lim2+d, lim2
				}
				if fbest < i1+i2 {
					fbest, fbest1 = i1+i2, i1
				}
			}
			bbest, bbest1 := lineMax, lineMax
			for d := bmax; d >= bmin; d -= 2 {
				i1 := max(off1, kb[d+o])
				i2 := i1 - d
				if i2 < off2 {
					i1, i2 = off2+d, off2
				}
				if i1+i2 < bbest {
					bbest, bbest1 = i1+i2, i1
				}
			}
			if (lim1+lim2)-bbest < fbest-(off1+off2) {
				return fbest1, fbest - fbest1, true, false
			}
			return bbest1, bbest - bbest1, false, true
		}
	}
}

// compact slides each group of changed lines of one side (recs, ch) as
// far down as it goes, merging the groups it meets, then back up to line
// up with a group of the other side (other) where one is in reach: git's
// xdl_change_compact without the indent heuristic. Sliding a group over
// lines equal to its own keeps the diff exact and its size; it only
// chooses the clearer of equivalent diffs.
func compact(recs []int32, ch, other []bool) {
	n, no := len(ch), len(other)
	g := group{}
	for g.end < n && ch[g.end] {
		g.end++
	}
	og := group{}
	for og.end < no && other[og.end] {
		og.end++
	}
	for {
		if g.end != g.start {
			var earliestEnd int
			for {
				size := g.end - g.start
				endMatchingOther := -1
				for g.slideUp(recs, ch) {
					if !og.previous(other) {
						panic("cowfs: diff: group sync broken sliding up")
					}
				}
				earliestEnd = g.end
				if og.end > og.start {
					endMatchingOther = g.end
				}
				for g.slideDown(recs, ch) {
					if !og.next(other) {
						panic("cowfs: diff: group sync broken sliding down")
					}
					if og.end > og.start {
						endMatchingOther = g.end
					}
				}
				if size == g.end-g.start {
					if g.end != earliestEnd && endMatchingOther != -1 {
						for og.end == og.start {
							if !g.slideUp(recs, ch) {
								panic("cowfs: diff: match disappeared")
							}
							if !og.previous(other) {
								panic("cowfs: diff: group sync broken sliding to match")
							}
						}
					}
					break
				}
			}
		}
		if !g.next(ch) {
			break
		}
		if !og.next(other) {
			panic("cowfs: diff: group sync broken moving to the next group")
		}
	}
}

// group is a run ch[start:end] of changed lines, possibly empty, between
// unchanged ones.
type group struct{ start, end int }

func (g *group) next(ch []bool) bool {
	if g.end == len(ch) {
		return false
	}
	g.start = g.end + 1
	g.end = g.start
	for g.end < len(ch) && ch[g.end] {
		g.end++
	}
	return true
}

func (g *group) previous(ch []bool) bool {
	if g.start == 0 {
		return false
	}
	g.end = g.start - 1
	g.start = g.end
	for g.start > 0 && ch[g.start-1] {
		g.start--
	}
	return true
}

func (g *group) slideDown(recs []int32, ch []bool) bool {
	if g.end < len(ch) && recs[g.start] == recs[g.end] {
		ch[g.start] = false
		ch[g.end] = true
		g.start++
		g.end++
		for g.end < len(ch) && ch[g.end] {
			g.end++
		}
		return true
	}
	return false
}

func (g *group) slideUp(recs []int32, ch []bool) bool {
	if g.start > 0 && recs[g.start-1] == recs[g.end-1] {
		g.start--
		g.end--
		ch[g.start] = true
		ch[g.end] = false
		for g.start > 0 && ch[g.start-1] {
			g.start--
		}
		return true
	}
	return false
}

// editScript turns the changed-line marks into an edit script. The
// unchanged lines of the two sides pair up in order.
func editScript(ca, cb []bool) []opCode {
	var out []opCode
	i, j := 0, 0
	for i < len(ca) || j < len(cb) {
		i2, j2 := i, j
		for i2 < len(ca) && j2 < len(cb) && !ca[i2] && !cb[j2] {
			i2++
			j2++
		}
		if i2 > i {
			out = append(out, opCode{'e', i, i2, j, j2})
			i, j = i2, j2
			continue
		}
		for i2 < len(ca) && ca[i2] {
			i2++
		}
		for j2 < len(cb) && cb[j2] {
			j2++
		}
		tag := byte('r')
		switch {
		case i2 == i && j2 == j:
			panic("cowfs: diff: unchanged lines do not pair up")
		case i2 == i:
			tag = 'i'
		case j2 == j:
			tag = 'd'
		}
		out = append(out, opCode{tag, i, i2, j, j2})
		i, j = i2, j2
	}
	return out
}
