package namespace

import (
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/dirent"
	"golang.org/x/sys/unix"
)

// etcSecrets are hidden even when world-readable would let them through.
var etcSecrets = []string{
	"/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-",
	"/etc/sudoers", "/etc/sudoers.d", "/etc/ssl/private", "/etc/security/opasswd",
	"/etc/krb5.keytab", "/etc/credstore", "/etc/credstore.encrypted",
	"/etc/NetworkManager/system-connections", "/etc/wireguard", "/etc/ipsec.secrets",
	"/etc/ppp/chap-secrets", "/etc/ppp/pap-secrets",
}

var (
	maskOnce sync.Once
	maskList []string
)

// etcMasks lists what /etc must not show: the known secrets and anything
// the world cannot read. The command runs as the caller's uid, so for a
// root caller every root-only file under /etc would otherwise be readable.
// Computed once per process: /etc changes rarely, and a file made private
// later is still unreadable to a non-root caller.
func etcMasks() []string {
	maskOnce.Do(func() { maskList = walkEtcMasks() })
	return maskList
}

// walkEtcMasks is etcMasks' walk, made anew at each call: the keeper,
// which lives across many processes' commands, walks again for each init
// it starts.
func walkEtcMasks() []string {
	var list []string
	seen := map[string]bool{}
	add := func(p string) {
		if !seen[p] {
			seen[p] = true
			list = append(list, p)
		}
	}
	for _, p := range etcSecrets {
		add(p)
	}
	walkPrivate("/etc", add)
	return list
}

// walkPrivate calls add, in lexical order, for what under root the world
// cannot read: a directory without world r-x (not descended into), any
// other entry without world r, and SSH host keys. Symlinks are left
// alone; entries that cannot be read are skipped. root itself is never
// added. It reads each directory with getdents and stats its entries
// relative to the directory's descriptor as they are read: the same
// answers as filepath.WalkDir with Lstat (the test compares them),
// without a path lookup and a FileInfo per entry, which made the walk a
// sixth of a CLI run's CPU, and without listing and sorting every
// directory first: only the few paths found are sorted, into the order
// of a walk that visits each directory's entries by name (comparePaths).
func walkPrivate(root string, add func(string)) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	buf := make([]byte, 32<<10)
	var found []string
	walkDirFd(fd, root, buf, func(p string) { found = append(found, p) })
	slices.SortStableFunc(found, comparePaths)
	for _, p := range found {
		add(p)
	}
}

// walkDirFd walks the open directory fd (path dir) and closes it. What
// it finds goes to add in no particular order. It descends into the
// subdirectories once the directory is read, since buf holds its listing
// until then.
func walkDirFd(fd int, dir string, buf []byte, add func(string)) {
	defer unix.Close(fd)
	var subdirs []string
	// An error ends the listing; the entries read until then are still walked.
	_ = dirent.Read(fd, buf, func(name []byte, typ uint8) {
		if typ == unix.DT_LNK {
			return
		}
		var st unix.Stat_t
		if unix.Fstatat(fd, string(name), &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			return
		}
		perm := st.Mode & 0o777
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			return
		case unix.S_IFDIR:
			if perm&0o005 != 0o005 {
				add(dir + "/" + string(name))
				return
			}
			subdirs = append(subdirs, string(name))
			return
		}
		if perm&0o004 == 0 {
			add(dir + "/" + string(name))
		}
		if isSSHHostKeyIn(dir, string(name)) {
			add(dir + "/" + string(name))
		}
	})
	for _, name := range subdirs {
		sub, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		walkDirFd(sub, dir+"/"+name, buf, add)
	}
}

// comparePaths orders slash-separated paths as a walk visiting each
// directory's entries by name lists them: component by component, a
// path before those beneath it ("a" < "a/b" < "a-c", where a plain
// string comparison puts "a-c" before "a/b").
func comparePaths(a, b string) int {
	for {
		ai, bi := strings.IndexByte(a, '/'), strings.IndexByte(b, '/')
		ac, bc := a, b
		if ai >= 0 {
			ac = a[:ai]
		}
		if bi >= 0 {
			bc = b[:bi]
		}
		if c := strings.Compare(ac, bc); c != 0 {
			return c
		}
		switch {
		case ai < 0 && bi < 0:
			return 0
		case ai < 0:
			return -1
		case bi < 0:
			return 1
		}
		a, b = a[ai+1:], b[bi+1:]
	}
}

// Prewarm starts computing etcMasks (the walk of /etc for what the
// sandbox must hide, a thousand entries and more, a few milliseconds) in
// the background, so that it overlaps whatever the caller does before its
// first Exec instead of delaying that Exec: New starts it, and so may a
// caller that knows it will make a namespace backend and has other work
// first (a CLI process opening the audit log and the transaction store).
// Calling it more than once costs nothing. It is not cached across
// processes: a file made private since would then show. It also has the
// runtime's process-start check made beside it
// (backend.PrewarmProcessStart): the init's start would wait for it.
func Prewarm() {
	go etcMasks()
	backend.PrewarmProcessStart()
}

// sshDir is the directory of the SSH host keys isSSHHostKey matches.
const sshDir = "/etc/ssh"

func isSSHHostKey(p string) bool {
	m, _ := filepath.Match(sshDir+"/ssh_host_*_key", p)
	return m
}

// isSSHHostKeyIn is isSSHHostKey(dir + "/" + name) for an entry name,
// which holds no "/": only names read in sshDir itself can match the
// pattern's literal directory, so no other entry's path is spelled for it.
func isSSHHostKeyIn(dir, name string) bool {
	return dir == sshDir && isSSHHostKey(dir+"/"+name)
}
