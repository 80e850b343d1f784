package docker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/docker/docker/api/types/mount"
	"golang.org/x/sys/unix"

	"github.com/pulse-agent/pulse/backend"
)

// cacheView is where the command sees the workspace: a cache there, or
// above it, would mix unreviewed writes into the captured ones.
const cacheView = "/work"

// commandGID is the group every command runs under (wrapper.sh sets it
// with the command's own uid). Commands of one container, and of every
// container mounting the same cache, have different uids, so a cache is
// shared through this group. It is below the command uids (20000 and
// up) and above the usual range of a host's own users and groups, so on
// the host the cache's group entry names no one's group. It opens
// nothing else: the kernel lets a process signal, trace or read the
// memory of another only when their uids match, and working copies are
// their uid's, mode 0700.
const commandGID = 19999

// checkCaches validates req.Caches and makes each host directory
// writable by the commands' group. Mounts are fixed when a container is
// created, so the caches are part of the box key: a request with another
// cache list gets a container of its own.
func checkCaches(req *backend.Request) (string, error) {
	if len(req.Caches) == 0 {
		return "", nil
	}
	if err := backend.CheckCaches(req.Caches, cacheView); err != nil {
		return "", fmt.Errorf("docker: %w", err)
	}
	ws, _ := filepath.EvalSymlinks(req.Workspace)
	parts := make([]string, 0, len(req.Caches))
	for _, c := range req.Caches {
		src, err := filepath.EvalSymlinks(c.HostDir)
		if err != nil {
			return "", fmt.Errorf("docker: cache %s: %v: %w", c.Name, err, backend.ErrInvalidRequest)
		}
		if ws != "" && (within(src, ws) || within(ws, src)) {
			return "", fmt.Errorf("docker: cache %s: host directory %s overlaps the workspace: %w", c.Name, src, backend.ErrInvalidRequest)
		}
		if strings.ContainsAny(src, ",\x00") {
			return "", fmt.Errorf("docker: cache %s: host directory %q cannot be bind-mounted: %w", c.Name, src, backend.ErrInvalidRequest)
		}
		if err := shareWithCommands(src); err != nil {
			return "", fmt.Errorf("docker: cache %s: %w", c.Name, err)
		}
		// The directory's identity too: a cache removed and made again
		// (pulse cache prune) is another directory, and a container's
		// bind of the old one (a warm container's, warm.go) would show
		// it deleted.
		var st unix.Stat_t
		if err := unix.Stat(src, &st); err != nil {
			return "", fmt.Errorf("docker: cache %s: %v: %w", c.Name, err, backend.ErrInvalidRequest)
		}
		parts = append(parts, src+"\x00"+c.Path+"\x00"+fmt.Sprintf("%d.%d", st.Dev, st.Ino))
	}
	sort.Strings(parts)
	return strings.Join(parts, "\x00\x00"), nil
}

func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// shareWithCommands lets every command, whatever its uid, create,
// change and remove entries in the cache dir and in whatever is made in
// it later: an access and a default POSIX ACL entry for commandGID, rwx,
// so that new entries inherit the entry whatever the creator's umask.
// Setting it needs the directory's owner or root; anyone else leaves it
// as it is (commands then may not write there). On a filesystem without
// POSIX ACLs, root gives the directory to commandGID, mode g+rwxs: new
// entries then belong to the group too, but their modes follow the
// creating command's umask, so an entry one command made below the top
// directory may be read-only to the next.
func shareWithCommands(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	err = grantACL(fd, uint32(st.Mode))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EPERM):
		return nil // neither owner nor root: as before, left alone
	case errors.Is(err, unix.ENOTSUP) && os.Geteuid() == 0:
		if st.Gid != commandGID {
			if err := unix.Fchown(fd, -1, commandGID); err != nil {
				return &os.PathError{Op: "chown", Path: dir, Err: err}
			}
		}
		if st.Mode&0o2070 != 0o2070 {
			if err := unix.Fchmod(fd, uint32(st.Mode)&0o7777|0o2070); err != nil {
				return &os.PathError{Op: "chmod", Path: dir, Err: err}
			}
		}
		return nil
	case errors.Is(err, unix.ENOTSUP):
		return nil
	}
	return &os.PathError{Op: "setting the commands' ACL on", Path: dir, Err: err}
}

// The Linux POSIX ACL xattr format (include/uapi/linux/posix_acl_xattr.h):
// a version word, then entries of tag, permissions and id, sorted by tag
// and id.
const (
	aclXattrAccess  = "system.posix_acl_access"
	aclXattrDefault = "system.posix_acl_default"
	aclVersion      = 2
	aclUserObj      = 0x01
	aclUser         = 0x02
	aclGroupObj     = 0x04
	aclGroup        = 0x08
	aclMask         = 0x10
	aclOther        = 0x20
	aclUndefinedID  = 0xffffffff
)

type aclEntry struct {
	tag, perm uint16
	id        uint32
}

// grantACL adds group commandGID rwx (and a mask that lets it through)
// to the directory's access and default ACLs, keeping their other
// entries; a directory that already has both is left untouched.
func grantACL(fd int, mode uint32) error {
	for _, name := range []string{aclXattrAccess, aclXattrDefault} {
		old, err := getACL(fd, name)
		if err != nil {
			return err
		}
		if old == nil {
			old = []aclEntry{
				{aclUserObj, uint16(mode>>6) & 7, aclUndefinedID},
				{aclGroupObj, uint16(mode>>3) & 7, aclUndefinedID},
				{aclOther, uint16(mode) & 7, aclUndefinedID},
			}
		}
		acl, changed := withCommandGroup(old)
		if !changed {
			continue
		}
		if err := unix.Fsetxattr(fd, name, encodeACL(acl), 0); err != nil {
			return err
		}
	}
	return nil
}

// getACL reads one ACL xattr; nil when there is none.
func getACL(fd int, name string) ([]aclEntry, error) {
	buf := make([]byte, 4+8*32)
	for {
		n, err := unix.Fgetxattr(fd, name, buf)
		if errors.Is(err, unix.ENODATA) {
			return nil, nil
		}
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if err != nil {
			return nil, err
		}
		return decodeACL(buf[:n])
	}
}

func decodeACL(b []byte) ([]aclEntry, error) {
	if len(b) < 4 || (len(b)-4)%8 != 0 || binary.LittleEndian.Uint32(b) != aclVersion {
		return nil, fmt.Errorf("an ACL of %d bytes in an unknown format", len(b))
	}
	var out []aclEntry
	for b = b[4:]; len(b) > 0; b = b[8:] {
		out = append(out, aclEntry{binary.LittleEndian.Uint16(b), binary.LittleEndian.Uint16(b[2:]), binary.LittleEndian.Uint32(b[4:])})
	}
	return out, nil
}

func encodeACL(acl []aclEntry) []byte {
	b := binary.LittleEndian.AppendUint32(nil, aclVersion)
	for _, e := range acl {
		b = binary.LittleEndian.AppendUint16(b, e.tag)
		b = binary.LittleEndian.AppendUint16(b, e.perm)
		b = binary.LittleEndian.AppendUint32(b, e.id)
	}
	return b
}

// withCommandGroup is acl with group commandGID rwx and a mask of rwx,
// in the kernel's order; changed is false when acl already had both.
func withCommandGroup(acl []aclEntry) (out []aclEntry, changed bool) {
	hasGroup, hasMask := false, false
	for _, e := range acl {
		switch {
		case e.tag == aclGroup && e.id == commandGID:
			hasGroup = e.perm == 7
		case e.tag == aclMask:
			hasMask = e.perm == 7
		default:
			out = append(out, e)
		}
	}
	if hasGroup && hasMask {
		return acl, false
	}
	out = append(out, aclEntry{aclGroup, 7, commandGID}, aclEntry{aclMask, 7, aclUndefinedID})
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].tag != out[j].tag {
			return out[i].tag < out[j].tag
		}
		return out[i].id < out[j].id
	})
	return out, true
}

// cacheMounts turns a box key's cache list back into bind mounts.
func cacheMounts(key string) []mount.Mount {
	if key == "" {
		return nil
	}
	var out []mount.Mount
	for _, p := range strings.Split(key, "\x00\x00") {
		f := strings.SplitN(p, "\x00", 3)
		src, dst := f[0], f[1]
		out = append(out, mount.Mount{Type: mount.TypeBind, Source: src, Target: dst,
			BindOptions: &mount.BindOptions{Propagation: mount.PropagationRPrivate, NonRecursive: true}})
	}
	return out
}
