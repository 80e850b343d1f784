package namespace

import (
	"io/fs"
	"path/filepath"
	"sync"
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
		_ = filepath.WalkDir("/etc", func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			if d.Type()&fs.ModeSymlink != 0 {
				return nil
			}
			info, err := d.Info()
			if err != nil {
				return nil
			}
			perm := info.Mode().Perm()
			if d.IsDir() {
				if p != "/etc" && perm&0o005 != 0o005 {
					add(p)
					return filepath.SkipDir
				}
				return nil
			}
			if perm&0o004 == 0 {
				add(p)
			}
			if info.Name() != "" && isSSHHostKey(p) {
				add(p)
			}
			return nil
		})
	})
	return maskList
}

// prewarmMasks starts computing etcMasks in the background, so that the
// walk of /etc (a thousand entries and more, a few milliseconds) overlaps
// whatever the caller does before its first Exec — in a CLI process,
// opening the audit log and the transaction store — instead of delaying
// that Exec. It is not cached across processes: a file made private since
// would then show.
func prewarmMasks() { go etcMasks() }

func isSSHHostKey(p string) bool {
	m, _ := filepath.Match("/etc/ssh/ssh_host_*_key", p)
	return m
}
