package remote

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/server/artifact"
	"github.com/pulse-agent/pulse/pathguard"
)

// manifestName is the overlay archive member that lists deletions. It
// lives under the reserved .pulse/ directory, where no written file can.
const manifestName = ".pulse/overlay.json"

// packLimits bounds a packed workspace.
type packLimits struct {
	// symlinks: the server accepts symlinks that stay inside the
	// workspace, so those are packed; others are still left out.
	symlinks   bool
	compressed int64
	unpacked   int64
	members    int
	// hidden are workspace paths left out, with all below them
	// (Request.Hidden): what is never uploaded cannot be read remotely.
	hidden map[string]bool
}

// extraFile is a file added to the archive that is not in the workspace.
type extraFile struct {
	name string
	data []byte
}

// packed is a workspace ready to upload.
type packed struct {
	data    []byte
	members int
	skipped []string // entries the server would refuse (symlinks, FIFOs, ...)
}

// errOverLimit stops a compressor that went over its limit.
var errOverLimit = errors.New("over limit")

type limitedBuffer struct {
	bytes.Buffer
	max int64
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if int64(b.Len()+len(p)) > b.max {
		return 0, errOverLimit
	}
	return b.Buffer.Write(p)
}

// pack writes the workspace at dir as a gzip-compressed tar, as the
// server's upload accepts it: regular files and directories only, with
// clean relative names, and nothing under .pulse/. Special files, and
// symlinks unless lim.symlinks allows those that stay inside the
// workspace, are left out (the server refuses them) and listed in
// skipped.
// Every limit is checked while packing, so an over-large workspace is
// refused before a byte is sent.
func pack(dir string, extra []extraFile, lim packLimits) (*packed, error) {
	return packView(dir, extra, lim, nil)
}

// packView is pack of the workspace with the pending view laid over it:
// what the view decides is packed from it (a pending deletion is left
// out, with everything beneath it), the rest from the workspace.
func packView(dir string, extra []extraFile, lim packLimits, pend *backend.Pending) (*packed, error) {
	out := &limitedBuffer{max: lim.compressed}
	zw, _ := gzip.NewWriterLevel(out, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	p := &packed{}
	var total int64
	mtime := time.Unix(0, 0)
	over := func(what string, limit int64) error {
		return fmt.Errorf("remote: workspace %s: more than %d %s: %w: %w", dir, limit, what, ErrTooLarge, backend.ErrUnsupported)
	}
	add := func(hdr *tar.Header, body io.Reader) error {
		p.members++
		if p.members > lim.members {
			return over("entries", int64(lim.members))
		}
		total += hdr.Size
		if total > lim.unpacked {
			return over("bytes of files", lim.unpacked)
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if body != nil {
			n, err := io.Copy(tw, body)
			if err != nil {
				return err
			}
			if n != hdr.Size {
				return fmt.Errorf("%s changed size while it was packed", hdr.Name)
			}
		}
		return nil
	}
	err := filepath.WalkDir(dir, func(p2 string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p2)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		if pathguard.IsReserved(rel) || lim.hidden[rel] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if e, decided := pend.Lookup(rel); decided {
			if d.IsDir() && (e == nil || e.Kind != backend.PendingDir) {
				return filepath.SkipDir
			}
			return nil // packed from the view below
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: rel, ModTime: mtime, Mode: int64(info.Mode().Perm()), Format: tar.FormatPAX}
		switch {
		case info.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
			return add(hdr, nil)
		case info.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, info.Size()
			f, err := os.Open(p2)
			if err != nil {
				return err
			}
			defer f.Close()
			return add(hdr, io.LimitReader(f, info.Size()))
		case info.Mode()&fs.ModeSymlink != 0 && lim.symlinks:
			target, err := os.Readlink(p2)
			if err != nil {
				return err
			}
			// The server's own rule, so that it never refuses the upload
			// for a link that could have been left out.
			if artifact.CheckLinkTarget(rel, target) != nil || artifact.ResolveInside(dir, rel) != nil {
				p.skipped = append(p.skipped, rel)
				return nil
			}
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, target, 0o777
			return add(hdr, nil)
		default:
			p.skipped = append(p.skipped, rel)
			return nil
		}
	})
	if err == nil && pend != nil {
		err = packPending(pend, lim, p, add, mtime)
	}
	if err == nil {
		for _, x := range extra {
			hdr := &tar.Header{Name: x.name, Typeflag: tar.TypeReg, Size: int64(len(x.data)), Mode: 0o600, ModTime: mtime, Format: tar.FormatPAX}
			if err = add(hdr, bytes.NewReader(x.data)); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = zw.Close()
	}
	if errors.Is(err, errOverLimit) {
		return nil, over("compressed bytes", lim.compressed)
	}
	if err != nil {
		if errors.Is(err, ErrTooLarge) {
			return nil, err
		}
		return nil, fmt.Errorf("remote: pack workspace %s: %w: %w", dir, err, backend.ErrInvalidRequest)
	}
	p.data = out.Bytes()
	return p, nil
}

// overlayLimits bounds an overlay archive from the server.
type overlayLimits struct {
	bytes   int64
	members int
}

// cleanMember validates a member name from the server and returns it
// clean and slash-separated. It fails closed: absolute names, "..",
// backslashes, NUL and over-long names are refused.
func cleanMember(name string) (string, error) {
	n := strings.TrimSuffix(name, "/")
	if n == "" || len(n) > pathguard.MaxPathLen || strings.ContainsAny(n, "\x00\\") || strings.HasPrefix(n, "/") {
		return "", fmt.Errorf("member %q: %w", name, ErrOverlay)
	}
	for _, part := range strings.Split(n, "/") {
		if part == ".." || len(part) > pathguard.MaxNameLen {
			return "", fmt.Errorf("member %q: %w", name, ErrOverlay)
		}
	}
	c := path.Clean(n)
	if c == "." {
		return "", fmt.Errorf("member %q: %w", name, ErrOverlay)
	}
	return c, nil
}

// unpackOverlay parses the overlay archive of download_artifact. Files
// come back byte-exact with their permission bits (never set-id),
// directories and symlinks by type; the manifest lists deletions. Any
// member that is unsafe, duplicated, reserved or over a limit fails the
// whole archive.
func unpackOverlay(data []byte, lim overlayLimits) (*backend.Overlay, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("remote: overlay: %s: %w", fmt.Sprintf(format, args...), ErrOverlay)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, bad("not gzip: %v", err)
	}
	// Headers and padding are bounded too, so a stream of empty blocks
	// cannot run on.
	tr := tar.NewReader(io.LimitReader(zr, lim.bytes+int64(lim.members+2)*3*512))
	ov := &backend.Overlay{}
	seen := map[string]bool{}
	var total int64
	members := 0
	manifest := false
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, bad("%v", err)
		}
		members++
		if members > lim.members {
			return nil, bad("more than %d members", lim.members)
		}
		name, err := cleanMember(hdr.Name)
		if err != nil {
			return nil, err
		}
		if hdr.Size < 0 || total+hdr.Size > lim.bytes {
			return nil, bad("more than %d bytes", lim.bytes)
		}
		if name == manifestName {
			if manifest || hdr.Typeflag != tar.TypeReg {
				return nil, bad("second or non-file manifest")
			}
			manifest = true
			body, err := io.ReadAll(io.LimitReader(tr, hdr.Size))
			if err != nil {
				return nil, bad("manifest: %v", err)
			}
			total += int64(len(body))
			var m struct {
				Version int      `json:"version"`
				Deleted []string `json:"deleted"`
			}
			if err := json.Unmarshal(body, &m); err != nil || m.Version != 1 {
				return nil, bad("manifest is not version 1 JSON")
			}
			for _, d := range m.Deleted {
				c, err := cleanMember(d)
				if err != nil {
					return nil, err
				}
				if pathguard.IsReserved(c) || seen["-"+c] {
					return nil, bad("deletion %q reserved or repeated", d)
				}
				seen["-"+c] = true
				ov.Deleted = append(ov.Deleted, c)
			}
			continue
		}
		if pathguard.IsReserved(name) {
			return nil, bad("member %q is under %s/", name, pathguard.ReservedDir)
		}
		if seen[name] {
			return nil, bad("member %q repeated", name)
		}
		seen[name] = true
		perm := fs.FileMode(hdr.Mode).Perm()
		f := backend.File{Path: name}
		switch hdr.Typeflag {
		case tar.TypeReg:
			body, err := io.ReadAll(io.LimitReader(tr, hdr.Size))
			if err != nil || int64(len(body)) != hdr.Size {
				return nil, bad("member %q truncated", name)
			}
			total += hdr.Size
			f.Mode, f.Data = perm, body
		case tar.TypeDir:
			f.Mode = fs.ModeDir | perm
		case tar.TypeSymlink:
			if hdr.Linkname == "" || strings.ContainsRune(hdr.Linkname, 0) || len(hdr.Linkname) > pathguard.MaxPathLen {
				return nil, bad("symlink %q has a bad target", name)
			}
			total += int64(len(hdr.Linkname))
			f.Mode, f.Data = fs.ModeSymlink|0o777, []byte(hdr.Linkname)
		default:
			return nil, bad("member %q has type %q", name, hdr.Typeflag)
		}
		ov.Files = append(ov.Files, f)
	}
	if !manifest {
		return nil, bad("no deletions manifest")
	}
	return ov, nil
}
