package artifact

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/internal/capture"
	"github.com/pulse-agent/pulse/internal/fsmode"
	"github.com/pulse-agent/pulse/pathguard"
	"github.com/pulse-agent/pulse/protocol"
)

// DiffTar is Diff for a workspace that lives elsewhere (on a pulse-worker)
// and came back as a tar.gz: it compares the archive's entries with the
// snapshot without writing anything to disk, so symlinks and odd names in
// a command's output are data, never followed. Limits bound the archive as
// they bound uploads; changed file contents are kept in memory, at most
// lim.MaxUnpacked bytes.
func (s *Snapshot) DiffTar(r io.Reader, lim protocol.ArchiveLimits) (*backend.Overlay, error) {
	lim = lim.WithDefaults()
	zr, err := gzip.NewReader(r)
	if err != nil {
		return nil, fmt.Errorf("%v: %w", err, protocol.ErrCorrupt)
	}
	tr := tar.NewReader(io.LimitReader(zr, protocol.TarBudget(lim.MaxUnpacked, lim.MaxMembers)))
	ov := &backend.Overlay{}
	seen := map[string]bool{}
	// A later member of a name replaces an earlier one, as GNU tar
	// extracts it: the overlay holds each path once.
	at := map[string]int{}
	var members int
	var total int64
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%v: %w", err, protocol.ErrCorrupt)
		}
		if members++; members > lim.MaxMembers {
			return nil, fmt.Errorf("more than %d members: %w", lim.MaxMembers, protocol.ErrLimit)
		}
		name, err := protocol.CleanName(hdr.Name)
		if err != nil {
			return nil, err
		}
		if name == "." || pathguard.IsReserved(name) {
			continue
		}
		e := entry{mode: fs.FileMode(hdr.Mode).Perm()}
		var data []byte
		switch hdr.Typeflag {
		case tar.TypeReg:
			if total+hdr.Size > lim.MaxUnpacked {
				return nil, fmt.Errorf("more than %d bytes: %w", lim.MaxUnpacked, ErrOverlayTooLarge)
			}
			var buf bytes.Buffer
			n, err := io.Copy(&buf, tr)
			if err != nil {
				return nil, fmt.Errorf("%q: %v: %w", name, err, protocol.ErrCorrupt)
			}
			total += n
			data = buf.Bytes()
			e.size = n
			e.hash = sha256.Sum256(data)
		case tar.TypeDir:
			e.mode |= fs.ModeDir
		case tar.TypeSymlink:
			e.mode = fs.ModeSymlink | fs.ModePerm&e.mode
			e.link = hdr.Linkname
			data = []byte(hdr.Linkname)
		default:
			// Hard links, devices and FIFOs are not content (see walk).
			continue
		}
		seen[name] = true
		f := backend.File{Path: name, Mode: e.mode}
		if !e.mode.IsDir() {
			f.Data = data
		}
		i, dup := at[name]
		if old, ok := s.entries[name]; ok && sameEntry(old, e) {
			if dup { // back to what it was: no change after all
				ov.Files[i].Path = ""
			}
			continue
		}
		if dup {
			ov.Files[i] = f
			continue
		}
		at[name] = len(ov.Files)
		ov.Files = append(ov.Files, f)
	}
	files := ov.Files[:0]
	for _, f := range ov.Files {
		if f.Path != "" {
			files = append(files, f)
		}
	}
	ov.Files = files
	ov.Deleted = s.deleted(seen)
	sort.Slice(ov.Files, func(i, j int) bool { return ov.Files[i].Path < ov.Files[j].Path })
	return ov, nil
}

// sameEntry compares entries as a tar can carry them: symlink permission
// bits are meaningless on Linux and not compared.
func sameEntry(a, b entry) bool {
	if a.mode&fs.ModeSymlink != 0 || b.mode&fs.ModeSymlink != 0 {
		return a.mode.Type() == b.mode.Type() && a.link == b.link
	}
	return a == b
}

// PackDir writes the workspace dir as a tar.gz of its regular files,
// directories and symlinks (not the reserved .pulse/), to ship it to a
// worker. It fails with protocol.ErrLimit past lim.
func PackDir(dir string, lim protocol.ArchiveLimits) ([]byte, error) {
	lim = lim.WithDefaults()
	var buf bytes.Buffer
	// The archive crosses a local network to a worker: speed matters more
	// than ratio.
	zw := protocol.NewGzipWriter(&buf, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	var members int
	var total int64
	err := walkPaths(dir, func(e *capture.Entry, link string) error {
		if members++; members > lim.MaxMembers {
			return fmt.Errorf("more than %d members: %w", lim.MaxMembers, protocol.ErrLimit)
		}
		hdr := &tar.Header{Name: e.Rel, Mode: int64(fsmode.ToUnix(e.FileMode())), ModTime: time.Unix(0, e.Mtime)}
		switch e.Type() {
		case unix.S_IFDIR:
			hdr.Typeflag, hdr.Name = tar.TypeDir, e.Rel+"/"
		case unix.S_IFLNK:
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, link
		default:
			if total += e.Size; total > lim.MaxUnpacked {
				return fmt.Errorf("more than %d bytes: %w", lim.MaxUnpacked, protocol.ErrLimit)
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, e.Size
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			return copyFile(tw, e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("artifact: pack: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	if int64(buf.Len()) > lim.MaxCompressed {
		return nil, fmt.Errorf("artifact: pack: %d compressed bytes: %w", buf.Len(), protocol.ErrLimit)
	}
	return buf.Bytes(), nil
}
