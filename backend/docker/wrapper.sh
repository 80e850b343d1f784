# Runs one command in its own copy of the sandbox workspace, then writes
# a report of what that command changed after its output, and merges
# those changes into the baseline.
#
# usage: sh -c WRAPPER pulse-exec ID DIR FSIZE NONCE [NAME=VALUE...] ARG...
#   FSIZE is the file size limit in 512-byte blocks (0: none);
#   NAME=VALUE... is the command's whole environment (env -i);
#   NONCE makes the markers ones the command's output cannot hit by chance.
# When the command has ended, the wrapper writes \036PULSE-ERR-NONCE\036
# to stderr, then \036PULSE-END-NONCE\036SIZE\n and a tar of SIZE bytes
# (out/ID, below) to stdout; so the host can tell the command's output
# from the report even when one exec runs many commands in turn.
#
# Layout. /pulse is a volume (the only place the engine copies into on a
# read-only root); the workspace arrives there as seed/. /work is a tmpfs,
# where metadata operations cost a fraction of a disk's:
#   /work/base/      the workspace as the next command will see it (copied
#                    from /pulse/seed by the first command)
#   /work/run/ID/    the copy command ID runs in
#   /work/run/ID.t/  the command's pgid and time files
#   /work/run/ID.*   the wrapper's manifests and lists
#   /work/out/ID/    what goes back to the host: status, pgid, time,
#                    deleted, warn, log, files-*.tar (the changed entries)
#   /work/base.manifest  manifest of base (see manifest below)
#   /work/lock/      held (mkdir is atomic) while base is copied or merged
#   /work/uid/U      held by the command running as uid U
# run/ID* and out/ID are removed before the wrapper exits.
#
# Who is who. The wrapper runs as root with a few capabilities (box.go).
# Each command runs as a uid of its own (20000 and up, no capabilities),
# and its copy and ID.t are that uid's, mode 0700: so the kernel keeps
# concurrent commands from signalling, tracing or reading the memory of
# each other and of the wrappers, and from entering each other's copies.
# Its group is G, the one all commands share (commandGID in caches.go):
# caches are shared through it, and the kernel's checks above go by uid.
# base is the sandbox user's (1000), mode 0700, and only ever changed as
# that user, so that a symlink a command merged into base cannot lead a
# later merge into another command's copy. Once the command has ended,
# every process of its uid is killed before root looks at its copy.
#
# Why a copy per command: concurrent commands on one container each get
# an overlay of their own writes only, measured against what they saw.
# Why the result goes through stdout: reading it back with the archive API
# would cost as much again as the exec.
set -u
id=$1 dir=$2 fsize=$3 nonce=$4
shift 4
P=/work
R=$P/run/$id
O=$P/out/$id
T=$R.t
B=1000 G=19999
um=$(umask)
umask 077
u=$((20000 + RANDOM))
# Each process costs: what exists already is not made again.
[ -d "$P/uid" ] || mkdir -p "$P/uid" 2>/dev/null
while ! mkdir "$P/uid/$u" 2>/dev/null && [ $u -lt 60000 ]; do u=$((u + 1)); done
if [ ! -d "$P/run" ]; then mkdir -p "$P/run" && chmod 0711 "$P/run"; fi
if [ $u -ge 60000 ] || ! mkdir -p "$O"; then
	rmdir "$P/uid/$u" 2>/dev/null
	printf '\036PULSE-ERR-%s\036' "$nonce" >&2
	printf '\036PULSE-END-%s\036%s\n' "$nonce" 0
	exit 125
fi
echo "$u" >"$O/uid"
exec 8>"$O/log"
# as UID CMD...: CMD as uid UID, with no capabilities.
as() { a=$1; shift; nsenter -S "$a" -G "$a" "$@"; }

lock() { while ! mkdir "$P/lock" 2>/dev/null; do usleep 1000; done; }
unlock() { rmdir "$P/lock"; }

# finish STATUS CODE: hand the out directory to the host and clean up.
finish() {
	echo "$1" >"$O/status"
	exec 8>&-
	tar -c -f "$O.tar" -C "$P/out" "$id" 2>/dev/null
	printf '\036PULSE-ERR-%s\036' "$nonce" >&2
	printf '\036PULSE-END-%s\036%s\n' "$nonce" "$(stat -c %s "$O.tar")"
	cat "$O.tar"
	rm -rf "$R" "$R".* "$O" "$O.tar"
	rmdir "$P/uid/$u"
	exit "$2"
}

# manifest DIR: one line per entry, .pulse/ excluded:
#   S<mode-hex>|<type>|<name>   (for a symlink: '<name>' -> '<target>')
#   <md5>  <name>               for regular files
manifest() (
	cd "$1" || exit 1
	find . -path ./.pulse -prune -o ! -path . -exec stat -c 'S%f|%F|%N' {} + -type f -exec md5sum {} +
)
# baseman DIR: manifest DIR >/work/base.manifest, as the sandbox user, who
# owns base.manifest (the sync script rewrites it).
baseman() { as $B sh -c 'cd "$1" || exit 1; find . -path ./.pulse -prune -o ! -path . -exec stat -c "S%f|%F|%N" {} + -type f -exec md5sum {} + >"$2"' mf "$1" "$P/base.manifest"; }


# base.manifest is manifest(base) whenever the lock is free, so a command
# gets its "before" for the price of copying one file.
lock
if [ ! -d "$P/base" ]; then
	as $B sh -c 'cp -a /pulse/seed "$1.tmp" && chmod 0700 "$1.tmp"' base "$P/base" 2>&8 &&
		baseman "$P/base.tmp" 2>&8 &&
		mv "$P/base.tmp" "$P/base" && rm -rf /pulse/seed
fi
cp -a "$P/base" "$R" 2>&8 && mkdir "$T" && chown -Rh "$u:$u" "$R" "$T" 2>&8 && chmod 0700 "$R" 2>&8 &&
	cp "$P/base.manifest" "$R.before" 2>&8
cprc=$?
unlock
[ $cprc = 0 ] || finish copy 125
cd "$R/$dir" 2>/dev/null || finish nodir 125
# setsid makes the command the leader of a new process group whose id it
# records, so that a kill from a second exec reaches its whole tree. time
# runs the command as its child and writes down how it ended (the shell
# alone cannot tell "killed by signal 15" from "exit 143") and its usage.
# The command gets stdin, stdout and stderr only: the exec starts with
# nothing else, and whatever the wrapper opened (its log on 8) is closed
# before it (a shell opens no descriptor above 9).
if [ "${PULSE_TTY:-}" = 1 ]; then
	# A command on a terminal runs in an exec of its own that the engine
	# gives a terminal (tty.go), started by the host once it reads the
	# uid here; the host sends its exit status on this exec's stdin (EOF:
	# the host is gone, and whatever runs is killed below).
	printf '\036PULSE-TTY-%s\036%s\n' "$nonce" "$u"
	read -r rc || rc=137
	case $rc in '' | *[!0-9]*) rc=126 ;; esac
else
	setsid nsenter -S "$u" -G "$G" sh -c 'exec 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-; umask "$1"; f=$2 p=$3 t=$4; shift 4; [ "$f" = 0 ] || ulimit -f "$f"; echo $$ >"$p"; exec time -o "$t" -f "usage %M %e %U %S" env -i "$@"' pulse-cmd "$um" "$fsize" "$T/pgid" "$T/time" "$@"
	rc=$?
fi
# Every process of the command's uid, setsid's included; as that uid, so
# nothing else can be hit. Until none is left: then nothing changes the
# copy while root reads it. kill's status cannot tell (kill -1 succeeds
# whenever another process exists, even if it may signal none), so the
# real uids in /proc do; a zombie counts until it is reaped. Read with
# the shell's own read: no process to start when nothing is left.
left() {
	for f in /proc/[0-9]*/status; do
		while read -r k v _; do
			[ "$k" = Uid: ] || continue
			[ "$v" = "$1" ] && return 0
			break
		done <"$f"
	done 2>/dev/null
	return 1
}
i=0
while left "$u" && [ $i -lt 1000 ]; do as "$u" kill -9 -1 2>/dev/null; usleep 1000; i=$((i + 1)); done
as "$u" cat "$T/time" >"$O/time" 2>/dev/null
cd /

manifest "$R" >"$R.after" 2>&8 || finish manifest "$rc"
# changed: entries new or different in after; removed: entries gone, or
# whose type changed, so that base drops them before the merge.
awk -v R="$R" -v O="$O" '
{
	side = FILENAME == ARGV[1] ? 1 : 2
	if (substr($0, 1, 1) == "S") {
		rest = substr($0, 2); i = index(rest, "|")
		mode = substr(rest, 1, i - 1); rest = substr(rest, i + 1)
		i = index(rest, "|"); typ = substr(rest, 1, i - 1); rest = substr(rest, i + 1)
		sig = mode
		if (typ == "symbolic link") {
			i = index(rest, "'"'"' -> '"'"'")
			if (i == 0) { print "odd symlink line" > (O "/warn"); next }
			sig = mode "|" substr(rest, i + 6, length(rest) - i - 6)
			rest = substr(rest, 2, i - 2)
		}
		if (side == 1) { bt[rest] = typ; bs[rest] = sig } else { at[rest] = typ; as[rest] = sig }
	} else if (length($0) > 34 && substr($0, 33, 2) == "  ") {
		p = substr($0, 35); h = substr($0, 1, 32)
		if (side == 1) bh[p] = h; else ah[p] = h
	} else {
		print "odd manifest line" > (O "/warn")
	}
}
END {
	for (p in at) {
		if (!(p in bt) || bs[p] != as[p] || bh[p] != ah[p]) print p > (R ".changed")
		if ((p in bt) && bt[p] != at[p]) print p > (R ".removed")
	}
	for (p in bt) if (!(p in at)) { print p > (R ".removed"); print p > (O "/deleted") }
}' "$R.before" "$R.after" 2>&8
# This busybox tar cannot read names from a file, so xargs hands them
# over in batches, each batch its own files-PID.tar.
if [ -s "$R.changed" ]; then
	tr '\n' '\0' <"$R.changed" | xargs -0 sh -c 'o=$1 r=$2; shift 2; cd "$r" && exec tar -c -f "$o/files-$$.tar" --no-recursion "$@"' pulse-tar "$O" "$R" 2>>"$O/warn"
fi
# base gets the modes of the archive as they are: tar as a user other
# than root applies the umask, so it is the exec's again, not 077.
umask "$um"
if [ -s "$R.changed" ] || [ -s "$R.removed" ]; then
	lock
	if [ -s "$R.removed" ]; then tr '\n' '\0' <"$R.removed" | as $B sh -c 'cd "$1" && xargs -0 rm -rf' rm "$P/base" 2>&8; fi
	for f in "$O"/files-*.tar; do [ -s "$f" ] && as $B tar -x -f - -C "$P/base" <"$f" 2>&8; done
	baseman "$P/base" 2>&8
	unlock
fi
finish "exit $rc" "$rc"
