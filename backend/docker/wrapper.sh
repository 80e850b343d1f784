# Runs one command in its own copy of the sandbox workspace and leaves
# behind, in /pulse/out/ID, exactly what that command changed.
#
# usage: sh -c WRAPPER pulse-exec ID DIR KIND FSIZE CLEAN ARG...
#   KIND is "args" (run ARG... as argv) or "shell" (ARG is a bash script);
#   FSIZE is the file size limit in 512-byte blocks (0: none);
#   CLEAN lists earlier IDs whose out directories the host has read.
#
# Layout of the /pulse volume (owned by the sandbox user):
#   base/      the workspace as the next command will see it
#   run/ID/    the copy command ID runs in (removed when it ends)
#   out/ID/    pgid, status, before, after, changed, removed, files-*.tar
#   lock/      held (mkdir is atomic) while base is copied or merged into
#
# Why a copy per command: concurrent commands on one container each get
# an overlay of their own writes only, measured against what they saw.
set -u
id=$1 dir=$2 kind=$3 fsize=$4 clean=$5
shift 5
P=/pulse
R=$P/run/$id
O=$P/out/$id
for c in $clean; do rm -rf "$P/out/$c"; done
mkdir -p "$P/run" "$O" || exit 125
exec 8>"$O/log"

lock() { while ! mkdir "$P/lock" 2>/dev/null; do usleep 1000; done; }
unlock() { rmdir "$P/lock"; }

# manifest DIR: one line per entry. S<mode-hex>|<type>|<path>, H<md5>|<path>
# for regular files and L<md5 of target>|<path> for symlinks; .pulse/ is
# never part of the workspace.
manifest() (
	cd "$1" || exit 1
	find . -path ./.pulse -prune -o ! -path . -exec stat -c 'S%f|%F|%n' {} + &&
	find . -path ./.pulse -prune -o -type f -exec md5sum {} + | sed 's/^\([0-9a-f]*\)  /H\1|/' &&
	find . -path ./.pulse -prune -o -type l -exec sh -c 'for l; do printf "L%s|%s\n" "$(readlink "$l" | md5sum | cut -c1-32)" "$l"; done' sh {} +
)

lock
cp -a "$P/base" "$R" 2>&8
cprc=$?
unlock
if [ $cprc != 0 ]; then echo copy >"$O/status"; exit 125; fi
manifest "$R" >"$O/before" 2>&8 || { echo manifest >"$O/status"; rm -rf "$R"; exit 125; }

if ! cd "$R/$dir" 2>/dev/null; then
	echo nodir >"$O/status"
	rm -rf "$R"
	exit 125
fi
if [ "$kind" = shell ]; then
	if [ -x /bin/bash ]; then set -- /bin/bash -c "$1"; else set -- /bin/sh -c "$1"; fi
fi
# setsid makes the command the leader of a new process group whose id
# it records, so that a kill from a second exec reaches its whole tree.
# time runs the command as its child and writes down how it ended (the
# shell alone cannot tell "killed by signal 15" from "exit 143") and its
# resource usage.
setsid /bin/sh -c 'f=$1 p=$2 t=$3; shift 3; [ "$f" = 0 ] || ulimit -f "$f"; echo $$ >"$p"; exec time -o "$t" -f "usage %M %e %U %S" "$@"' pulse-cmd "$fsize" "$O/pgid" "$O/time" "$@"
rc=$?
pg=$(cat "$O/pgid" 2>/dev/null)
[ -n "$pg" ] && kill -9 -- "-$pg" 2>/dev/null
cd /

manifest "$R" >"$O/after" 2>&8 || { echo manifest >"$O/status"; rm -rf "$R"; exit "$rc"; }
# changed: entries new or different in after; removed: entries gone, or
# whose type changed, so that base drops them before the merge.
awk -v O="$O" '
function parse(line,   t, rest, i) {
	t = substr(line, 1, 1); rest = substr(line, 2)
	i = index(rest, "|")
	if (t == "S") {
		kv = substr(rest, 1, i - 1); rest = substr(rest, i + 1)
		i = index(rest, "|"); typ = substr(rest, 1, i - 1)
		path = substr(rest, i + 1)
		return "S"
	}
	if (t == "H" || t == "L") { kv = substr(rest, 1, i - 1); path = substr(rest, i + 1); return t }
	return ""
}
{
	side = FILENAME == ARGV[1] ? 1 : 2
	k = parse($0)
	if (k == "") { print "odd manifest line" > (O "/warn"); next }
	if (side == 1) { if (k == "S") { bt[path] = typ; bs[path] = kv } else bh[path] = kv }
	else { if (k == "S") { at[path] = typ; as[path] = kv } else ah[path] = kv }
}
END {
	for (p in at) {
		if (!(p in bt) || bs[p] != as[p] || bh[p] != ah[p]) print p > (O "/changed")
		if ((p in bt) && bt[p] != at[p]) print p > (O "/removed")
	}
	for (p in bt) if (!(p in at)) { print p > (O "/removed"); print p > (O "/deleted") }
}' "$O/before" "$O/after" 2>&8
touch "$O/changed" "$O/removed" "$O/deleted"
sort -o "$O/changed" "$O/changed"
# This busybox tar cannot read names from a file, so xargs hands them
# over in batches, each batch its own files-PID.tar.
if [ -s "$O/changed" ]; then
	tr '\n' '\0' <"$O/changed" | xargs -0 sh -c 'o=$1 r=$2; shift 2; cd "$r" && exec tar -c -f "$o/files-$$.tar" --no-recursion "$@"' pulse-tar "$O" "$R" 2>>"$O/warn"
fi
lock
if [ -s "$O/removed" ]; then (cd "$P/base" && tr '\n' '\0' <"$O/removed" | xargs -0 rm -rf 2>&8); fi
for f in "$O"/files-*.tar; do [ -s "$f" ] && tar -x -f "$f" -C "$P/base" 2>&8; done
unlock
rm -rf "$R"
echo "exit $rc" >"$O/status"
exit "$rc"
