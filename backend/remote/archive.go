package remote

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/protocol"
)

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
	zw := protocol.NewGzipWriter(out, gzip.BestSpeed)
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
	err := pend.WalkBase(dir, lim.hidden, func(rel, p2 string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
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
			if protocol.CheckLinkTarget(rel, target) != nil || resolvesOutside(dir, rel) {
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
	if err == nil {
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

// resolvesOutside reports whether rel, followed through every link in
// dir, leads out of it: the server refuses such a link.
func resolvesOutside(dir, rel string) bool {
	_, err := protocol.Resolve(dir, rel)
	return err != nil
}
