package cacheshare

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func readACL(t *testing.T, path, name string) []aclEntry {
	t.Helper()
	buf := make([]byte, 1024)
	n, err := unix.Getxattr(path, name, buf)
	if err == unix.ENODATA || err == unix.ENOTSUP {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	acl, err := decodeACL(buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	return acl
}

// hasModel says whether acl gives the owner and GID perm through its mask.
func hasModel(acl []aclEntry, owner uint32, perm uint16) bool {
	_, changed := withModel(acl, owner, perm)
	return acl != nil && !changed
}

// TestShareInheritedByNewEntries: the entries Share sets on the top
// directory are inherited by what is made in it later, whatever the
// umask, and a second call changes nothing.
func TestShareInheritedByNewEntries(t *testing.T) {
	dir := t.TempDir()
	owner := uint32(os.Geteuid())
	if err := Share(dir); err != nil {
		t.Fatal(err)
	}
	old := unix.Umask(0o077)
	sub := filepath.Join(dir, "sub")
	err := os.Mkdir(sub, 0o777)
	if err == nil {
		err = os.WriteFile(filepath.Join(sub, "f"), []byte("x"), 0o666)
	}
	unix.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, xattr string
		perm        uint16
	}{{dir, aclXattrAccess, 7}, {dir, aclXattrDefault, 7}, {sub, aclXattrAccess, 7}, {sub, aclXattrDefault, 7}, {filepath.Join(sub, "f"), aclXattrAccess, 6}} {
		acl := readACL(t, c.path, c.xattr)
		if acl == nil {
			t.Skipf("the filesystem of %s keeps no POSIX ACLs", dir)
		}
		if !hasModel(acl, owner, c.perm) {
			t.Errorf("%s %s: %+v lacks user %d and group %d with %o through the mask", c.path, c.xattr, acl, owner, GID, c.perm)
		}
	}
	before := readACL(t, dir, aclXattrAccess)
	if err := Share(dir); err != nil {
		t.Fatal(err)
	}
	if after := readACL(t, dir, aclXattrAccess); len(after) != len(before) {
		t.Errorf("a second call changed the ACL: %+v -> %+v", before, after)
	}
}

// TestShareRepairsWhatWasThereBefore: a cache filled before it had the
// model (by a command of one backend, umask 022) gets it on every
// directory and file at its first Share; a symlink in it that leads out
// of the cache is not followed.
func TestShareRepairsWhatWasThereBefore(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := unix.Umask(0o022)
	deep := filepath.Join(dir, "a", "b")
	err := os.MkdirAll(deep, 0o777)
	if err == nil {
		err = os.WriteFile(filepath.Join(deep, "f"), []byte("x"), 0o666)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "x.sh"), []byte("x"), 0o755)
	}
	if err == nil {
		err = os.Symlink(outside, filepath.Join(deep, "link"))
	}
	unix.Umask(old)
	if err != nil {
		t.Fatal(err)
	}
	if err := Share(dir); err != nil {
		t.Fatal(err)
	}
	owner := uint32(os.Geteuid())
	if readACL(t, dir, aclXattrAccess) == nil {
		t.Skipf("the filesystem of %s keeps no POSIX ACLs", dir)
	}
	for _, c := range []struct {
		path, xattr string
		perm        uint16
	}{
		{filepath.Join(dir, "a"), aclXattrAccess, 7}, {filepath.Join(dir, "a"), aclXattrDefault, 7},
		{deep, aclXattrAccess, 7}, {deep, aclXattrDefault, 7},
		{filepath.Join(deep, "f"), aclXattrAccess, 6}, {filepath.Join(dir, "x.sh"), aclXattrAccess, 7},
	} {
		if acl := readACL(t, c.path, c.xattr); !hasModel(acl, owner, c.perm) {
			t.Errorf("%s %s: %+v lacks user %d and group %d with %o", c.path, c.xattr, acl, owner, GID, c.perm)
		}
	}
	if acl := readACL(t, outside, aclXattrAccess); acl != nil {
		t.Errorf("the walk followed a symlink out of the cache: %s has %+v", outside, acl)
	}
}

// TestWidenSince: files made under the model with the umask already
// applied to their mode (as gVisor's Sentry makes them: 0644, so the
// kernel narrows the mask to r--) get what their owner has (rw) through
// the mask once widened; a file made read-only on purpose stays so, and
// an entry older than since is left as it is.
func TestWidenSince(t *testing.T) {
	dir := t.TempDir()
	if err := Share(dir); err != nil {
		t.Fatal(err)
	}
	if readACL(t, dir, aclXattrDefault) == nil {
		t.Skipf("the filesystem of %s keeps no POSIX ACLs", dir)
	}
	owner := uint32(os.Geteuid())
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("x"), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := mk("old", 0o644)
	time.Sleep(ctimeSlack + 100*time.Millisecond)
	since := time.Now()
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	made, ro := mk("sub/made", 0o644), mk("sub/ro", 0o444)
	if hasModel(readACL(t, made, aclXattrAccess), owner, 6) {
		t.Fatal("a 0644 file got rw through the mask before widening: the test shows nothing here")
	}
	if err := WidenSince(dir, since); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path string
		perm uint16
		want bool
	}{{made, 6, true}, {sub, 7, true}, {ro, 6, false}, {ro, 4, true}, {old, 6, false}} {
		if got := hasModel(readACL(t, c.path, aclXattrAccess), owner, c.perm); got != c.want {
			t.Errorf("%s: %o through the mask is %v, want %v (%+v)", c.path, c.perm, got, c.want, readACL(t, c.path, aclXattrAccess))
		}
	}
}
