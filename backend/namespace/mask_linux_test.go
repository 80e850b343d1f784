package namespace

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// walkPrivateReference is what walkPrivate replaced: filepath.WalkDir
// with an Lstat per entry. The fast walk must give the same list, in the
// same order.
func walkPrivateReference(root string, add func(string)) {
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		perm := info.Mode().Perm()
		if d.IsDir() {
			if p != root && perm&0o005 != 0o005 {
				add(p)
				return filepath.SkipDir
			}
			return nil
		}
		if perm&0o004 == 0 {
			add(p)
		}
		if isSSHHostKey(p) {
			add(p)
		}
		return nil
	})
}

func collect(walk func(string, func(string)), root string) []string {
	var got []string
	walk(root, func(p string) { got = append(got, p) })
	return got
}

// TestWalkPrivateMatchesWalkDir builds a tree of every case (private and
// public files and directories, nested, symlinks to private files and to
// directories, a fifo, many entries for several getdents reads) and
// compares the fast walk with the reference on it and on the real /etc.
func TestWalkPrivateMatchesWalkDir(t *testing.T) {
	root := t.TempDir()
	mk := func(rel string, mode fs.FileMode) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	dir := func(rel string, mode fs.FileMode) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Chmod(p, 0o755) })
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	mk("public", 0o644)
	mk("private", 0o600)
	mk("group-only", 0o640)
	mk("world-write-only", 0o602)
	dir("pub", 0o755)
	mk("pub/secret", 0o600)
	// Siblings whose names sort before "pub/" as strings ('-' and '.'
	// are below '/') but after everything beneath pub in a walk.
	mk("pub-sibling", 0o600)
	mk("pub.z", 0o600)
	mk("pub/open", 0o644)
	dir("pub/deeper", 0o755)
	mk("pub/deeper/key", 0o400)
	dir("pub/noexec", 0o754) // world r without x: hidden whole
	mk("pub/noexec/inner", 0o600)
	if err := os.Symlink("../private", filepath.Join(root, "pub/link-to-private")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(root+"/pub", filepath.Join(root, "link-to-dir")); err != nil {
		t.Fatal(err)
	}
	for i := range 600 {
		mode := fs.FileMode(0o644)
		if i%7 == 0 {
			mode = 0o600
		}
		mk(filepath.Join("pub", "many-"+string(rune('a'+i%26))+string(rune('a'+i/26))+"-with-a-long-name-to-fill-the-buffer"), mode)
	}
	// A private directory is hidden whole, not descended into, though
	// the caller (root here) could list it.
	dir("closed", 0o700)
	mk("closed/whatever", 0o644)
	if err := unix.Mkfifo(filepath.Join(root, "pub", "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := collect(walkPrivateReference, root)
	got := collect(walkPrivate, root)
	if !slices.Equal(got, want) {
		t.Fatalf("fast walk of the test tree:\n%q\nreference:\n%q", got, want)
	}
	if len(want) < 90 {
		t.Fatalf("the test tree gave only %d masks: %q", len(want), want)
	}
	if got, want := collect(walkPrivate, "/etc"), collect(walkPrivateReference, "/etc"); !slices.Equal(got, want) {
		t.Fatalf("fast walk of /etc:\n%q\nreference:\n%q", got, want)
	}
}

// BenchmarkWalkEtc compares the fast walk of /etc with the reference
// walk it replaced (x-vs-walkdir below 1 is faster).
func BenchmarkWalkEtc(b *testing.B) {
	var fast, ref int64
	for b.Loop() {
		t0 := monoNow()
		walkPrivate("/etc", func(string) {})
		t1 := monoNow()
		walkPrivateReference("/etc", func(string) {})
		t2 := monoNow()
		fast += t1 - t0
		ref += t2 - t1
	}
	b.ReportMetric(float64(fast)/float64(ref), "x-vs-walkdir")
}

// TestSSHHostKeyInMatchesThePath: the walk's check of an entry by its
// directory and name answers as the check of its whole path does.
func TestSSHHostKeyInMatchesThePath(t *testing.T) {
	dirs := []string{"/etc/ssh", "/etc", "/etc/ssh/sshd_config.d", "/tmp/etc/ssh", "/etc/sshd", ""}
	names := []string{"ssh_host_rsa_key", "ssh_host_ed25519_key", "ssh_host__key", "ssh_host_rsa_key.pub",
		"ssh_host_key", "sshd_config", "x_ssh_host_rsa_key"}
	hits := 0
	for _, d := range dirs {
		for _, n := range names {
			want := isSSHHostKey(d + "/" + n)
			if got := isSSHHostKeyIn(d, n); got != want {
				t.Errorf("isSSHHostKeyIn(%q, %q) = %v, isSSHHostKey of the path %v", d, n, got, want)
			}
			if want {
				hits++
			}
		}
	}
	if hits != 3 {
		t.Fatalf("%d host key paths in the table, want 3 (the table lost its point)", hits)
	}
}

// TestComparePathsIsWalkOrder: sorting with comparePaths gives the order
// a walk by names visits paths in, not plain string order.
func TestComparePathsIsWalkOrder(t *testing.T) {
	walk := []string{"/etc/a", "/etc/a/b", "/etc/a/b/c", "/etc/a/d", "/etc/a-c", "/etc/a.d/x", "/etc/ab", "/etc/b"}
	got := slices.Clone(walk)
	slices.Reverse(got)
	slices.SortStableFunc(got, comparePaths)
	if !slices.Equal(got, walk) {
		t.Fatalf("sorted %q, want %q", got, walk)
	}
	if plain := slices.Sorted(slices.Values(walk)); slices.Equal(plain, walk) {
		t.Fatalf("the table is in plain string order too, so it shows nothing: %q", plain)
	}
}
