// Package cacheshare gives a cache's host directory the one ownership
// model every backend relies on, so that a cache filled by a command on
// one backend can be read, changed and emptied by a command on another.
//
// The backends run commands as different users: the namespace backend as
// the caller's uid (uid 0 of its user namespace, mapped to the caller and
// nothing else), the Docker backend as a uid of each command's own (20000
// and up) whose group is GID. Neither can be the other, and no backend
// can give a command capabilities over the other's files. So the cache
// says who may write it, in POSIX ACLs:
//
//   - its owner is the owner of the cache's top directory (the user whose
//     cache root it is under);
//   - every directory's access and default ACL, and every other file's
//     access ACL, give rwx to that owner (a named user entry, for the
//     entries a Docker command owns) and to group GID, with a mask that
//     lets both through. A default ACL is inherited by whatever is made
//     below, whoever makes it and whatever the umask, so what one
//     backend's command makes, the other's may change.
//
// Share sets the top directory so on every use and, the first time (the
// top directory did not have it yet), walks the cache once to give what a
// command made before the same entries, as far as it may: entries only
// their owner or root can change (a Docker command's, when pulse does not
// run as root) are left as they are.
//
// What the model cannot change: the kernel narrows the mask of a new
// entry to the group bits of the mode its creator asked for (not the
// umask), so a file made read-only on purpose (Go's module cache makes
// its files 0444) is read-only to everyone, on every backend. A
// filesystem without POSIX ACLs gets, when pulse runs as root, the group
// GID and mode g+rwxs on the top directory only; entries below then have
// the modes their command's umask gave.
package cacheshare

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	"golang.org/x/sys/unix"
)

// GID is the group every Docker command runs under, through which
// commands of different uids share a cache. It is below the command uids
// (20000 and up) and above the usual range of a host's own users and
// groups, so on the host the cache's group entry names no one's group.
const GID = 19999

// Share applies the model to the cache directory dir (see the package
// comment). Setting it needs the directory's owner or root; anyone else
// leaves it as it is, and commands of other uids then may not write there.
func Share(dir string) error {
	fd, st, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	changed, err := grantACL(fd, st.Uid, uint32(st.Mode), true)
	switch {
	case err == nil:
		if changed {
			// The first use under this model: what is already in the
			// cache gets the entries too.
			repairTree(fd, 0, func(cfd int, cst *unix.Stat_t, isDir bool) {
				_, _ = grantACL(cfd, st.Uid, uint32(cst.Mode), isDir)
			})
		}
		return nil
	case errors.Is(err, unix.EPERM):
		return nil // neither owner nor root: left alone
	case errors.Is(err, unix.ENOTSUP) && os.Geteuid() == 0:
		if st.Gid != GID {
			if err := unix.Fchown(fd, -1, GID); err != nil {
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
	return &os.PathError{Op: "setting the cache's ACL on", Path: dir, Err: err}
}

// WidenSince gives every directory and regular file below dir whose
// inode changed at or after since (its ctime, less ctimeSlack) the
// model's entries with
// the permissions its owner has: what a command made there is then
// open to the other backends' commands as far as to its maker.
//
// Why: a backend whose kernel does not read POSIX ACLs (gVisor's Sentry)
// applies the command's umask itself before the file reaches the host,
// so a file made 0644 under a default ACL gets a mask of r--, where the
// host kernel, which ignores the umask under a default ACL, would have
// given rw-. Widening to the owner's bits keeps a file made read-only on
// purpose read-only. It walks the whole cache (a stat an entry) and
// changes only what is new; what it cannot open or change it leaves.
func WidenSince(dir string, since time.Time) error {
	fd, st, err := openDir(dir)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// A file's times come from the kernel's coarse clock, a tick or so
	// behind time.Now: what was made just after since may read as just
	// before it. Widening a little more than was new changes nothing
	// the model does not give anyway.
	ns := since.Add(-ctimeSlack).UnixNano()
	repairTree(fd, 0, func(cfd int, cst *unix.Stat_t, isDir bool) {
		if cst.Ctim.Nano() < ns {
			return
		}
		if perm := uint16(cst.Mode>>6) & 7; perm != 0 {
			_, _ = grantPerm(cfd, st.Uid, uint32(cst.Mode), isDir, perm)
		}
	})
	return nil
}

// openDir opens the cache directory dir, never through a symlink, and
// stats it.
func openDir(dir string) (int, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, st, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, st, &os.PathError{Op: "stat", Path: dir, Err: err}
	}
	return fd, st, nil
}

// ctimeSlack is how much earlier than since an entry's ctime may be and
// still count as changed at or after it.
const ctimeSlack = time.Second

// maxRepairDepth bounds the walk of repairTree: a tree deeper than this is
// a command's doing, not a tool's cache.
const maxRepairDepth = 64

// repairTree calls visit for every directory and regular file below
// directory fd, never following a symlink: each entry is opened
// from its parent's descriptor with O_NOFOLLOW, so a command that swaps a
// directory for a link while the walk runs cannot lead it out of the
// cache. What cannot be opened or changed is left as it is.
func repairTree(dirfd int, depth int, visit func(fd int, st *unix.Stat_t, isDir bool)) {
	if depth >= maxRepairDepth {
		return
	}
	d, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(d), "cache")
	defer f.Close()
	for {
		names, err := f.Readdirnames(256)
		for _, name := range names {
			var st unix.Stat_t
			if unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
				continue
			}
			var flags int
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFDIR:
				flags = unix.O_RDONLY | unix.O_DIRECTORY
			case unix.S_IFREG:
				flags = unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY
			default:
				continue
			}
			cfd, err := unix.Openat(dirfd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			var cst unix.Stat_t
			if unix.Fstat(cfd, &cst) == nil && cst.Ino == st.Ino && cst.Dev == st.Dev {
				isDir := cst.Mode&unix.S_IFMT == unix.S_IFDIR
				visit(cfd, &cst, isDir)
				if isDir {
					repairTree(cfd, depth+1, visit)
				}
			}
			unix.Close(cfd)
		}
		if err != nil {
			return
		}
	}
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

// grantACL gives the owner and group GID rwx (rw, and x where the file's
// owner has it, for a file that is not a directory) and a mask that lets
// them through, in the access ACL and, for a directory, the default ACL,
// keeping the other entries; changed says whether anything was missing.
func grantACL(fd int, owner, mode uint32, isDir bool) (changed bool, err error) {
	perm := uint16(7)
	if !isDir {
		perm = 6 | uint16(mode>>6)&1
	}
	return grantPerm(fd, owner, mode, isDir, perm)
}

// grantPerm is grantACL with the permissions to give.
func grantPerm(fd int, owner, mode uint32, isDir bool, perm uint16) (changed bool, err error) {
	names := []string{aclXattrAccess}
	if isDir {
		names = append(names, aclXattrDefault)
	}
	for _, name := range names {
		old, err := getACL(fd, name)
		if err != nil {
			return changed, err
		}
		if old == nil {
			old = []aclEntry{
				{aclUserObj, uint16(mode>>6) & 7, aclUndefinedID},
				{aclGroupObj, uint16(mode>>3) & 7, aclUndefinedID},
				{aclOther, uint16(mode) & 7, aclUndefinedID},
			}
		}
		acl, ch := withModel(old, owner, perm)
		if !ch {
			continue
		}
		if err := unix.Fsetxattr(fd, name, encodeACL(acl), 0); err != nil {
			return changed, err
		}
		changed = true
	}
	return changed, nil
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

// withModel is acl with user owner and group GID given perm, and a mask
// of at least perm, in the kernel's order; changed is false when acl
// already had them.
func withModel(acl []aclEntry, owner uint32, perm uint16) (out []aclEntry, changed bool) {
	hasUser, hasGroup := false, false
	mask := uint16(0)
	hasMask := false
	for _, e := range acl {
		switch {
		case e.tag == aclUser && e.id == owner:
			hasUser = e.perm&perm == perm
		case e.tag == aclGroup && e.id == GID:
			hasGroup = e.perm&perm == perm
		case e.tag == aclMask:
			mask, hasMask = e.perm, true
			continue
		default:
			out = append(out, e)
			continue
		}
	}
	if hasUser && hasGroup && hasMask && mask&perm == perm {
		return acl, false
	}
	out = append(out, aclEntry{aclUser, perm, owner}, aclEntry{aclGroup, perm, GID}, aclEntry{aclMask, mask | perm, aclUndefinedID})
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].tag != out[j].tag {
			return out[i].tag < out[j].tag
		}
		return out[i].id < out[j].id
	})
	return out, true
}
