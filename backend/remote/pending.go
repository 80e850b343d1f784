package remote

import (
	"archive/tar"
	"bytes"
	"io"
	"time"

	"github.com/pulse-agent/pulse/backend"
	"github.com/pulse-agent/pulse/protocol"
)

// packPending adds the entries of the pending view that are present (not
// deleted, not beneath a deletion) to an upload, after the workspace's:
// the server then runs the command on the workspace plus the stack, and
// the overlay it returns is relative to that, so a command deleting a
// pending-only file reports it deleted. The view is sorted, so a pending
// directory comes before what it holds.
func packPending(pend *backend.Pending, lim packLimits, p *packed, add func(*tar.Header, io.Reader) error, mtime time.Time) error {
	for _, e := range pend.Shown(lim.hidden) {
		hdr := &tar.Header{Name: e.Path, ModTime: mtime, Mode: int64(e.Mode.Perm()), Format: tar.FormatPAX}
		switch e.Kind {
		case backend.PendingDir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, e.Path+"/"
			if err := add(hdr, nil); err != nil {
				return err
			}
		case backend.PendingFile:
			data, err := e.ReadAll()
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
			if err := add(hdr, bytes.NewReader(data)); err != nil {
				return err
			}
		case backend.PendingSymlink:
			// The server's own rule, as for the workspace's links; a link
			// the server would refuse is left out and listed.
			if !lim.symlinks || protocol.CheckLinkTarget(e.Path, e.Target) != nil {
				p.skipped = append(p.skipped, e.Path)
				continue
			}
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, e.Target, 0o777
			if err := add(hdr, nil); err != nil {
				return err
			}
		}
	}
	return nil
}
