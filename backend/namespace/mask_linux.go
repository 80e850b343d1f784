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
	maskOnce.Do(func() {
		seen := map[string]bool{}
		add := func(p string) {
			if !seen[p] {
				seen[p] = true
				maskList = append(maskList, p)
			}
		}
		for _, p := range etcSecrets {
			add(p)
		}
		walkPrivate("/etc", add)
	})
	return maskList
}

// walkPrivate calls add, in lexical order, for what under root the world
// cannot read: a directory without world r-x (not descended into), any
// other entry without world r, and SSH host keys. Symlinks are left
// alone; entries that cannot be read are skipped. root itself is never
// added. It reads each directory with getdents and stats its entries
// relative to the directory's descriptor: the same answers as
// filepath.WalkDir with Lstat (the test compares them), without a path
// lookup and a FileInfo per entry, which made the walk a sixth of a CLI
// run's CPU.
func walkPrivate(root string, add func(string)) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	buf := make([]byte, 32<<10)
	walkDirFd(fd, root, buf, add)
}

// walkDirFd walks the open directory fd (path dir) and closes it.
func walkDirFd(fd int, dir string, buf []byte, add func(string)) {
	type ent struct {
		name string
		typ  uint8
	}
	var ents []ent
	// An error ends the listing; the entries read until then are still walked.
	_ = dirent.Read(fd, buf, func(name []byte, typ uint8) {
		ents = append(ents, ent{string(name), typ})
	})
	slices.SortFunc(ents, func(a, b ent) int { return strings.Compare(a.name, b.name) })
	defer unix.Close(fd)
	for _, e := range ents {
		if e.typ == unix.DT_LNK {
			continue
		}
		var st unix.Stat_t
		if unix.Fstatat(fd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		// The path is spelled only for what is added or descended into:
		// a thousand and more entries are neither.
		perm := st.Mode & 0o777
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			continue
		case unix.S_IFDIR:
			if perm&0o005 != 0o005 {
				add(dir + "/" + e.name)
				continue
			}
			sub, err := unix.Openat(fd, e.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			walkDirFd(sub, dir+"/"+e.name, buf, add)
			continue
		}
		if perm&0o004 == 0 {
			add(dir + "/" + e.name)
		}
		if isSSHHostKeyIn(dir, e.name) {
			add(dir + "/" + e.name)
		}
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
