# Shared by wrapper.sh and the sync script (sync.go), which run with it
# in front of them: how to read and update a manifest (see manifest in
# wrapper.sh). Its first line is G<n>, the generation: a number made
# greater by every change of the manifest, so that a copy that was equal
# to base at generation n knows it still is while the line reads G<n>.

# The awk functions all manifest readers share. parse sets N, SIG, TYP,
# H and returns 1 for an entry line, 2 for a hash line, 3 for the
# generation, 0 for anything else; name is parse's fast path for what
# most lines are (FS="|", names without "|", not symlinks), setting N.
AWKLIB='
function parse(l,   rest, i) {
	N = ""; SIG = ""; TYP = ""; H = ""
	if (substr(l, 1, 1) == "S") {
		rest = substr(l, 2); i = index(rest, "|")
		if (i == 0) return 0
		SIG = substr(rest, 1, i - 1); rest = substr(rest, i + 1)
		i = index(rest, "|")
		if (i == 0) return 0
		TYP = substr(rest, 1, i - 1); rest = substr(rest, i + 1)
		if (TYP == "regular empty file") TYP = "regular file"
		if (TYP == "symbolic link") {
			i = index(rest, "'"'"' -> '"'"'")
			if (i == 0) return 0
			SIG = SIG "|" substr(rest, i + 6, length(rest) - i - 6)
			rest = substr(rest, 2, i - 2)
		}
		SIG = SIG "|" TYP; N = rest
		return 1
	}
	if (length(l) > 34 && substr(l, 33, 2) == "  ") { H = substr(l, 1, 32); N = substr(l, 35); return 2 }
	if (l ~ /^G[0-9]+$/) return 3
	return 0
}
function name(   t) {
	if (NF == 3 && $2 != "symbolic link" && substr($0, 1, 1) == "S") { N = $3; return 1 }
	if (NF == 1 && substr($0, 33, 2) == "  " && length($0) > 34) { N = substr($0, 35); return 2 }
	return parse($0)
}
# under(p, set): whether a directory above p is in set.
function under(p, set,   q) {
	q = p
	while (match(q, /\/[^\/]*$/) && RSTART > 1) {
		q = substr(q, 1, RSTART - 1)
		if (q in set) return 1
	}
	return 0
}
'
# mfupdate MANIFEST GONE NEW [DELTA]: MANIFEST without the entries named
# in GONE (one a line) and all beneath them, with NEW's entries (manifest
# lines) in place of its own, and the next generation; replaced by rename.
# With DELTA (base's, by the wrapper and the sync script, both under the
# lock), what the step changed, for a copy that was equal to MANIFEST
# before it (wrapper.sh's repair): DELTA.drop, every name of GONE and NEW,
# and DELTA.fix, NEW's names, directories before what is in them, each
# after the line "G<old> G<new>" (the generations before and after); or
# "x" alone when a copy cannot be brought along by removing the first and
# copying the second (an existing directory in NEW but not in GONE: its
# removal would take what is in it). Both are written before MANIFEST is
# replaced, and removed should that fail, so their line names MANIFEST's
# generation only when they say how it came about.
mfupdate() {
	awk -F '|' -v D="${4:-}" "$AWKLIB"'
	FILENAME == ARGV[1] { gone[$0] = 1; ng++; next }
	FILENAME == ARGV[2] { t = parse($0); if (t == 1 || t == 2) { new[N] = 1; add[++n] = $0 } else bad = 1; next }
	!g { g = 1; if ($0 ~ /^G[0-9]+$/) { og = $0; print "G" (substr($0, 2) + 1); next } print "G1" }
	{
		t = name()
		if (t == 0) { bad = 1; exit 1 }
		if (t == 1 && NF == 3 && $2 == "directory" && (N in new) && !(N in gone)) cx = 1
		if (t != 3 && !(N in gone) && !(N in new) && !(ng && under(N, gone))) print
	}
	END {
		if (bad) exit 1
		if (!g) print "G1"
		for (i = 1; i <= n; i++) print add[i]
		if (D == "") exit
		h = "x"
		if (og != "" && !cx) h = og " G" (substr(og, 2) + 1)
		print h > (D ".drop"); print h > (D ".fix")
		if (h == "x") exit
		for (p in gone) print p > (D ".drop")
		md = 0
		for (p in new) {
			print p > (D ".drop")
			q = p; d = gsub(/\//, "", q); byd[d] = byd[d] p "\n"
			if (d > md) md = d
		}
		for (i = 0; i <= md; i++) printf "%s", byd[i] > (D ".fix")
	}' "$2" "$3" "$1" >"$1.tmp" && mv "$1.tmp" "$1" && return 0
	[ -z "${4:-}" ] || rm -f "$4.drop" "$4.fix"
	return 1
}
# A name holding a newline would make two lines of a manifest, the first
# naming another entry (unlisted in sync.go): the host never puts one in
# base, and should one be there all the same, no manifest lists it or
# anything beneath it.
nl='
'
# fullman DIR MANIFEST: the manifest of all of DIR, of the generation
# after MANIFEST's.
fullman() {
	g=0
	if [ -e "$2" ]; then read -r g <"$2" || g=G0; fi
	case $g in G[0-9]*) g=${g#G} ;; *) g=0 ;; esac
	(echo "G$((g + 1))" && cd "$1" && find . -path ./.pulse -prune -o -name "*$nl*" -prune -o ! -path . -exec stat -c 'S%f|%F|%N' {} + -type f -exec md5sum {} +) >"$2.tmp" && mv "$2.tmp" "$2"
}
