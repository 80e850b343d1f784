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
#   /work/run/U/     the copy the commands of uid U run in, one at a time;
#                    kept for the next command of U, which gets it brought
#                    to base by changing only what differs (repair below)
#   /work/run/U.man  manifest of run/U as its last command left it, known
#                    to be so only while U.gen is not empty (else run/U is
#                    made again)
#   /work/run/U.gen  the generation of base run/U is equal to ("x": none)
#   /work/run/ID.t/  command ID's pgid and time files
#   /work/run/ID.*   the wrapper's manifests and lists
#   /work/out/ID/    what goes back to the host: status, pgid, time,
#                    deleted, warn, log, disk, nomerge, basefail, batches
#                    (see finish: the changed entries follow it, read
#                    straight from the copy)
#   /work/base.manifest  manifest of base (see manifest below), kept up
#                    to date by each change of base, not made again
#   /work/lock/      held (mkdir is atomic) while base is copied or merged
#   /work/reserve    room kept for the wrapper's lists (see the mark below)
#   /work/uid/U      held by the command running as uid U
# run/ID* and out/ID are removed before the wrapper exits.
#
# Who is who. The wrapper runs as root with a few capabilities (box.go).
# Each command runs as a uid no running command shares (20000 and up, no
# capabilities), and its copy and ID.t are that uid's, mode 0700: so the
# kernel keeps concurrent commands from signalling, tracing or reading the
# memory of each other and of the wrappers, and from entering each
# other's copies. A uid is taken again only by a later command, once
# every process of the earlier one is gone (like the earlier command's
# files in /tmp, which lasts across commands, its uid outlives it).
# Its group is G, the one all commands share (commandGID in caches.go):
# caches are shared through it, and the kernel's checks above go by uid.
# base is the sandbox user's (1000), mode 0700, and only ever changed as
# that user, so that a symlink a command merged into base cannot lead a
# later merge into another command's copy; a copy is only ever changed
# as its uid (or made anew by root), so that a symlink a command left in
# it leads nowhere that uid could not write anyway. Once the command has
# ended, every process of its uid is killed before root looks at its copy.
#
# What a command changed: every change of an entry (content, mode,
# owner, links, a rename onto it) sets its ctime to the kernel's clock,
# and no process can set ctime itself. The wrapper makes a mark file
# after the copy is ready and before the command starts: an entry whose
# ctime is earlier than the mark's was not touched by the command, and
# only the others (ctime at or after the mark, so also those changed in
# the mark's own clock tick) are hashed and compared with what the copy
# held. Should the clock go back while the command runs (a second mark
# after it is earlier than the first), every file is hashed. When no
# entry's ctime is at or after the mark, the top of the copy's included,
# nothing changed (an entry made, removed or renamed changes its
# directory's ctime), and the copy's manifest is not even read.
#
# Why a copy per command: concurrent commands on one container each get
# an overlay of their own writes only, measured against what they saw.
# Why copies are kept: a copy made anew costs a copy, an ownership change
# and a hash of every file, and gives every file a new inode and ctime,
# so that tools that cache what they saw by those (git's index, make)
# start from nothing each command.
# Why the result goes through stdout: reading it back with the archive API
# would cost as much again as the exec.
set -u
id=$1 dir=$2 fsize=$3 nonce=$4
shift 4
P=/work
O=$P/out/$id
Q=$P/run/$id
T=$Q.t
B=1000 G=19999
# The umask the command gets, read with the shell's own read: $(umask)
# would cost a process.
um=
{ while read -r k v _; do [ "$k" = Umask: ] && um=$v && break; done </proc/self/status; } 2>/dev/null
[ -n "$um" ] || um=$(umask)
umask 077
# Each process costs: what exists already is not made again.
[ -d "$P/uid" ] || mkdir -p "$P/uid" 2>/dev/null
u=20000
while ! mkdir "$P/uid/$u" 2>/dev/null && [ $u -lt 60000 ]; do u=$((u + 1)); done
R=$P/run/$u
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

# keep: the uid (and its copy) may serve a later command; not when a
# process of it outlived the kill below. drop: the copy goes (it filled
# the scratch tmpfs), the uid may serve again.
keep=1 kept=2 drop=0 stream=0
# tarb MODE DIR NAME...: a tar of the named entries of DIR, each alone,
# to stdout (emit) or its size (size); $Q.tfail once a tar failed.
tarb='m=$1 r=$2 f=$3; shift 3; cd "$r" || { : >"$f"; exit 1; }
if [ "$m" = size ]; then { tar -c -f - --no-recursion "$@" || : >"$f"; } | wc -c; else tar -c -f - --no-recursion "$@" || : >"$f"; fi'
# measure CODE: for the report of finish, the sizes of the batches of
# changed entries read straight from the copy (out/ID/batches) and their
# sum (t); the copy cannot change between this and the reading, every
# process of its uid being gone (else, keep=0, it is not read: status
# manifest CODE, as for a measure that fails).
measure() {
	if [ $keep = 1 ]; then
		tr '\n' '\0' <"$Q.changed" | xargs -0 sh -c "$tarb" pulse-tar size "$R" "$Q.tfail" >"$O/batches" 2>>"$O/warn"
		if [ $? = 0 ] && [ ! -e "$Q.tfail" ]; then
			while read -r n; do t=$((t + n)); done <"$O/batches"
			return
		fi
		rm -f "$O/batches"
	else
		echo "a process of the command outlived it: what it changed is not read back" >>"$O/warn"
	fi
	echo "manifest $1" >"$O/status"
}
# finish STATUS CODE: hand the out directory to the host and clean up.
# The report is the out directory's tar, with the changed entries in
# its files-*.tar; or, where the tmpfs had no room for those (stream=1,
# or none for the out directory's tar with them), the out directory's tar
# without them, then their tars read straight from the copy, then one
# byte, 0 when they all came out whole: then no copy of what the command
# wrote is made on the tmpfs it may have filled. This busybox tar cannot
# read names from a file, so xargs hands them over in batches, a tar
# each: the batches' sizes (measure) go in out/ID/batches, so the host
# knows the report's size before it comes and where each batch starts.
finish() {
	echo "$1" >"$O/status"
	exec 8>&-
	t=0 ex=0
	[ -s "$Q.changed" ] && [ "${1%% *}" = exit ] && ex=1
	[ $stream = 1 ] && [ $ex = 1 ] && measure "$2"
	if ! tar -c -f "$O.tar" -C "$P/out" "$id" 2>/dev/null && [ $stream = 0 ] && [ $ex = 1 ]; then
		rm -f "$O"/files-*.tar "$O.tar"
		stream=1
		measure "$2"
		tar -c -f "$O.tar" -C "$P/out" "$id" 2>/dev/null
	fi
	printf '\036PULSE-ERR-%s\036' "$nonce" >&2
	if [ $t = 0 ]; then
		# stat writes the marker and the size itself: $(stat) would cost
		# a second process. (The nonce is hex: no format directive in it;
		# rs, set in front of this script, is \036.)
		stat -c "${rs}PULSE-END-$nonce$rs%s" "$O.tar"
		cat "$O.tar"
	else
		s=$(stat -c %s "$O.tar")
		printf '%sPULSE-END-%s%s%s\n' "$rs" "$nonce" "$rs" $((s + t + 1))
		cat "$O.tar"
		# Exactly t bytes whatever happens, so that the stream of a
		# pooled exec stays in step; a short or failed batch says 1.
		{ tr '\n' '\0' <"$Q.changed" | xargs -0 sh -c "$tarb" pulse-tar emit "$R" "$Q.tfail" || : >"$Q.tfail"; cat /dev/zero; } 2>/dev/null | head -c "$t"
		if [ -e "$Q.tfail" ]; then printf 1; else printf 0; fi
	fi
	# Copies are kept for the first uids only, which sequential commands
	# use: those of concurrent ones would hold memory for nothing. The
	# uid is given back last (rm removes in the order given), once its
	# copy is what R.man says or gone.
	if [ $keep = 1 ] && [ $drop = 0 ] && [ $u -lt $((20000 + kept)) ]; then
		rm -rf "$Q".* "$O" "$O.tar" "$P/uid/$u"
	else
		rm -rf "$Q".* "$O" "$O.tar" "$R" "$R.man" "$R.gen"
		[ $keep = 1 ] && rmdir "$P/uid/$u"
	fi
	exit "$2"
}

# The manifests (of base, base.manifest, and of each copy, R.man) are
# the runtime's ($RT fullman, mfupdate, mdiff, capture: internal/boxrt):
# one line per entry, .pulse/ excluded, after the generation line G<n>.
# baseman DIR: the manifest of DIR into base.manifest, given to the
# sandbox user, as whom the sync script reads and replaces it.
baseman() { "$RT" fullman "$1" "$P/base.manifest" && chown $B:$B "$P/base.manifest"; }

# base.manifest is manifest(base) whenever the lock is free.
lock
if [ ! -d "$P/base" ]; then
	as $B sh -c 'cp -a /pulse/seed "$1.tmp" && chmod 0700 "$1.tmp"' base "$P/base" 2>&8 &&
		baseman "$P/base.tmp" 2>&8 &&
		mv "$P/base.tmp" "$P/base" && rm -rf /pulse/seed
fi
# Repair: the copy the last command of this uid left is brought to base.
# When base is of the generation the copy was equal to (R.gen), nothing
# is to be done. When it is of the next one, and the step between left
# what it changed (base.drop and base.fix, see mfupdate), the copy gets
# that step: removed, as the uid, what it removed or changed, and
# extracted, as the uid, what it made or changed (read from base as the
# sandbox user). Else the copy's manifest (R.man) and base's tell what
# differs: removed what base does not hold as it is, extracted what base
# holds and the copy does not. Anything odd, or a step that fails (a
# directory the command made read-only), and the copy is made anew.
# $before is then the copy's manifest: R.man itself when the copy is used
# as it is, else Q.before. R.gen is emptied first (by the shell, no
# process): a copy is used again only after a wrapper wrote its manifest
# and then its generation, which no copy's use leaves empty ("x": none).
{ read -r bg <"$P/base.manifest"; } 2>/dev/null || bg=
{ read -r rg <"$R.gen"; } 2>/dev/null || rg=
: >"$R.gen"
before=$Q.before
# fix (names on stdin, NUL-separated, directories before what is in
# them): copies them from base into the copy, as the sandbox user and the
# uid, with the modes they have in base (umask 0; tar as a user other
# than root applies it); touches Q.fail when that fails.
fix() {
	xargs -r -0 sh -c 'f=$1 r=$2 u=$3; shift 3; cd /work/base || exit 1
{ nsenter -S 1000 -G 1000 tar -c -f - --no-recursion "$@" || : >"$f"; } |
	(umask 0 && exec nsenter -S "$u" -G "$u" tar -x -o -f - -C "$r") || : >"$f"' fix "$Q.fail" "$R" "$u" 2>&8
	[ ! -e "$Q.fail" ]
}
# drop (names on stdin, NUL-separated): removes them from the copy, as the
# uid, from a cd of root's (no shell of the uid's: a process less).
drop() { { cd "$R" && as $u xargs -r -0 rm -rf; } 2>&8 && cd /; }
# .pulse/ at the top of the copy is pruned from every listing, so what
# the last command wrote there was never reported nor merged: it goes
# before anything else, whatever the generations say (a copy used as it
# is would hand it on). Should that fail, the copy is made anew (rg
# empty: none of the branches below takes it).
if [ -n "$rg" ] && { [ -e "$R/.pulse" ] || [ -h "$R/.pulse" ]; }; then as $u rm -rf "$R/.pulse" 2>&8 || rg=; fi
fresh=1
if [ -d "$R" ] && [ -s "$R.man" ] && [ -n "$bg" ] && [ "$rg" = "$bg" ]; then
	fresh=0
	before=$R.man
elif [ -d "$R" ] && [ -s "$R.man" ] && [ -n "$rg" ] && { read -r dh <"$P/base.drop" && read -r fh <"$P/base.fix"; } 2>/dev/null &&
	[ "$dh" = "$rg $bg" ] && [ "$fh" = "$dh" ]; then
	fresh=0
	# The first line of each is the generations'.
	[ $fresh = 1 ] || { read -r _ && tr '\n' '\0'; } <"$P/base.drop" | drop || fresh=1
	[ $fresh = 1 ] || { read -r _ && tr '\n' '\0'; } <"$P/base.fix" | fix || fresh=1
	[ $fresh = 1 ] || cp "$P/base.manifest" "$Q.before" 2>&8 || fresh=1
elif [ -d "$R" ] && [ -s "$R.man" ] && [ -n "$rg" ]; then
	fresh=0
	"$RT" mdiff "$P/base.manifest" "$R.man" "$Q.drop" "$Q.fix" 2>&8 || fresh=1
	if [ $fresh = 0 ] && [ -s "$Q.drop" ]; then tr '\n' '\0' <"$Q.drop" | drop || fresh=1; fi
	if [ $fresh = 0 ] && [ -s "$Q.fix" ]; then tr '\n' '\0' <"$Q.fix" | fix || fresh=1; fi
	[ $fresh = 1 ] || cp "$P/base.manifest" "$Q.before" 2>&8 || fresh=1
fi
if [ $fresh = 1 ]; then
	{ [ ! -e "$R.man" ] || rm -f "$R.man"; } && { [ ! -e "$R" ] || rm -rf "$R"; } && cp -a "$P/base" "$R" 2>&8 && chown -Rh "$u:$u" "$R" 2>&8 && chmod 0700 "$R" 2>&8 &&
		cp "$P/base.manifest" "$Q.before" 2>&8
	cprc=$?
else
	cprc=0
fi
[ $cprc = 0 ] && mkdir "$T" && chown "$u:$u" "$T" 2>&8
cprc=$?
unlock
[ $cprc = 0 ] || finish copy 125
# The mark (see "What a command changed" above): after the copy is made
# anew, a few clock ticks first, so that not every entry is at or after it.
[ $fresh = 0 ] || usleep 20000
# A reserve on the scratch tmpfs for the wrapper's own lists, freed when
# a command has filled the tmpfs (its bound, limits.disk_bytes), so that
# what it wrote is still listed and reported. 8 MiB, made by the first
# command and again by the first after one freed it: allocating it costs
# tens of milliseconds, too much for every command. (1 MiB written by
# the shell itself where there is no fallocate.)
[ -s "$P/reserve" ] || fallocate -l 8388608 "$P/reserve" 2>/dev/null || { printf '%1048576s' '' >"$P/reserve"; } 2>/dev/null
: >"$Q.m0"
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
	# The command's uid and group are set by capdrop (capdrop.go),
	# which first empties the capability bounding set; where it was not
	# injected, by nsenter, and the bounding set stays the wrapper's.
	cs='exec 3>&- 4>&- 5>&- 6>&- 7>&- 8>&- 9>&-; umask "$1"; f=$2 p=$3 t=$4; shift 4; [ "$f" = 0 ] || ulimit -f "$f"; echo $$ >"$p"; exec time -o "$t" -f "usage %M %e %U %S" env -i "$@"'
	if [ -x /.pulse-tools/capdrop ]; then
		sh=/bin/sh
		[ -x /.pulse-tools/bin/sh ] && sh=/.pulse-tools/bin/sh
		setsid /.pulse-tools/capdrop "$u" "$G" "$sh" -c "$cs" pulse-cmd "$um" "$fsize" "$T/pgid" "$T/time" "$@"
	else
		setsid nsenter -S "$u" -G "$G" sh -c "$cs" pulse-cmd "$um" "$fsize" "$T/pgid" "$T/time" "$@"
	fi
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
left "$u" && keep=0
# full: the tmpfs the command filled (no block left), found before the
# reserve is freed: /work, whose size is limits.disk_bytes (a byte the
# shell cannot write there, no process), or, for a command that failed,
# /tmp. What it wrote is reported as always (out/ID/disk says which, for
# the host to name the limit); a full /work (wfull) has it neither merged
# into base, which would not hold it (nomerge), nor kept in the copy.
full= wfull=0
{ printf x >"$Q.probe"; } 2>/dev/null || { full=/work wfull=1 && : >"$P/reserve"; }
if [ "$rc" != 0 ]; then
	for l in $(stat -f -c '%a:%n' /tmp 2>/dev/null); do case $l in 0:*) full="$full ${l#0:}" ;; esac; done
fi
[ -z "$full" ] || echo $full >"$O/disk"
if [ $wfull = 1 ]; then : >"$Q.bad"; drop=1; fi
as "$u" cat "$T/time" >"$O/time" 2>/dev/null
cd /
: >"$Q.m1"
# breaklinks: every regular file of the copy with more than one link
# becomes a file of its own, with its content, mode and mtime, as the uid
# (a copy made beside it, then renamed over it; a directory the command
# made read-only, or a file it made unreadable, is given the owner's
# right for that only): so the copy kept for the next command, the
# changes merged into base and those reported are separate files, as the
# pending stack holds them, and a later write to one name does not change
# the other. Should that fail, the listing fails: what the command wrote
# is reported lost, not handed on with a copy that differs from it.
breaklinks() {
	{ cd "$R" && find . -path ./.pulse -prune -o -type f -links +1 -print0 |
		as $u xargs -r -0 sh -c 'for f; do
	d=${f%/*} dm= fm= t=
	if [ ! -w "$d" ] || [ ! -x "$d" ]; then dm=$(stat -c %a "$d") && chmod u+wx "$d" || exit 1; fi
	if [ ! -r "$f" ]; then fm=$(stat -c %a "$f") && chmod u+r "$f" || exit 1; fi
	t=$(mktemp "$f.XXXXXX") && cp -p "$f" "$t" &&
		{ [ -z "$fm" ] || { chmod "$fm" "$f" && chmod "$fm" "$t"; }; } &&
		mv -f "$t" "$f" || { [ -z "$t" ] || rm -f "$t"; exit 1; }
	[ -z "$dm" ] || chmod "$dm" "$d" || exit 1
done' pulse-unlink; } 2>&8
	r=$?
	cd /
	return $r
}
# What the command changed (capture, in the runtime: by ctime against
# the mark m0, which no process can set, hashing only what changed since
# it) goes to Q.changed, Q.new, Q.removed, O/deleted and, for names
# holding a newline, O/newline; Q.bad when the copy may not be kept. A
# regular file of more than one link (the command's ln): the links are
# broken and the copy captured again.
lk=0
while :; do
	"$RT" capture "$R" "$Q" "$O" "$before" 2>&8
	c=$?
	[ $c = 0 ] && break
	if [ $c = 3 ] && [ $lk = 0 ]; then
		breaklinks && lk=1 && continue
	fi
	[ $c = 3 ] && echo "a hard link the command made could not be broken" >>"$O/warn"
	finish "manifest $rc" "$rc"
done
# The changed entries, in files-PID.tar in the out directory, a batch
# each (this busybox tar cannot read names from a file, so xargs hands
# them over in batches); where the tmpfs has no room for them (the
# command filled it, or what it wrote is large), they are read straight
# from the copy instead, when merged and when reported (stream; finish).
if [ -s "$Q.changed" ]; then
	if [ $wfull = 1 ]; then
		stream=1
	elif ! tr '\n' '\0' <"$Q.changed" | xargs -0 sh -c 'o=$1 r=$2; shift 2; cd "$r" && exec tar -c -f "$o/files-$$.tar" --no-recursion "$@"' pulse-tar "$O" "$R" 2>"$Q.tarerr"; then
		rm -f "$O"/files-*.tar
		stream=1
	elif [ -s "$Q.tarerr" ]; then
		cat "$Q.tarerr" >>"$O/warn"
	fi
fi
# base gets the modes of the archive as they are: umask 0, since tar as a
# user other than root applies the umask. What the copy is kept with: when
# base did not change while the command ran (its generation is still bg),
# the copy is base after the merge, of its generation; else its own
# manifest (before with the changes), of no generation.
[ -e "$Q.removed" ] || : >"$Q.removed"
man=$before gen=x
if [ $wfull = 1 ] && { [ -s "$Q.changed" ] || [ -s "$Q.removed" ]; }; then
	: >"$O/nomerge"
	man=
elif [ -s "$Q.changed" ] || [ -s "$Q.removed" ]; then
	[ -e "$Q.new" ] || : >"$Q.new"
	lock
	{ read -r ng <"$P/base.manifest"; } 2>/dev/null || ng=
	mok=1
	# As in the repair: root's cd and umask, the sandbox user's rm and tar.
	if [ -s "$Q.removed" ]; then { cd "$P/base" && tr '\n' '\0' <"$Q.removed" | as $B xargs -0 rm -rf; } 2>&8 || mok=0; cd /; fi
	# The changed entries, extracted as the sandbox user: from their
	# tars, or straight from the copy, a batch at a time (stream).
	if [ $mok = 1 ] && [ $stream = 0 ]; then
		for f in "$O"/files-*.tar; do [ -s "$f" ] && { (umask 0 && exec nsenter -S $B -G $B tar -x -f - -C "$P/base") <"$f" 2>&8 || mok=0; }; done
	elif [ $mok = 1 ] && [ -s "$Q.changed" ]; then
		tr '\n' '\0' <"$Q.changed" | xargs -0 sh -c 'r=$1 b=$2 f=$3; shift 3; cd "$r" || exit 1
{ tar -c -f - --no-recursion "$@" || : >"$f"; } | (umask 0 && exec nsenter -S 1000 -G 1000 tar -x -f - -C "$b") || : >"$f"' pulse-merge "$R" "$P/base" "$Q.mfail" 2>&8 || mok=0
		[ ! -e "$Q.mfail" ] || mok=0
	fi
	# A merge that failed part way (base would not hold what changed)
	# leaves base without the changed entries, room freed for the report,
	# and the host learns that base is not what it thinks (basefail); the
	# copy goes too.
	if [ $mok = 0 ]; then
		{ cd "$P/base" && tr '\n' '\0' <"$Q.changed" | as $B xargs -0 rm -rf; } 2>&8
		cd /
		: >"$O/basefail"
		: >"$Q.bad"
		drop=1
	fi
	{ [ $mok = 1 ] && "$RT" mfupdate "$P/base.manifest" "$Q.removed" "$Q.new" "$P/base" 2>&8 && chown $B:$B "$P/base.manifest" "$P/base.drop" "$P/base.fix"; } || baseman "$P/base" 2>&8
	if [ -n "$ng" ] && [ "$ng" = "$bg" ] && [ $mok = 1 ]; then
		{ read -r gen <"$P/base.manifest" && cp "$P/base.manifest" "$Q.after"; } 2>&8 && man=$Q.after || man=
	else
		"$RT" mfupdate "$before" "$Q.removed" "$Q.new" 2>&8 || man=
	fi
	unlock
else
	# Read without the lock: base.manifest is replaced by rename.
	{ read -r ng <"$P/base.manifest"; } 2>/dev/null || ng=
	[ -n "$ng" ] && [ "$ng" = "$bg" ] && gen=$ng
fi
# R.gen last: only a copy with its manifest is used again.
[ $keep = 1 ] && [ ! -e "$Q.bad" ] && [ -n "$man" ] && { [ "$man" = "$R.man" ] || mv "$man" "$R.man"; } && echo "$gen" >"$R.gen"
finish "exit $rc" "$rc"
