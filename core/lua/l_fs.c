/*
 * core.fs: the file-system steps the host takes around a sandbox (core/lib/fs.c), so a
 * tenant's storage needs no shell. None follows a symlink in the last component.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "fs.h"
#include "lcorral.h"
#include "path.h"

static mode_t check_mode(lua_State *L, int arg)
{
    lua_Integer m = luaL_checkinteger(L, arg);
    luaL_argcheck(L, m >= 0 && m <= 07777, arg, "mode must be within 0..07777");
    return (mode_t)m;
}

static unsigned check_id(lua_State *L, int arg)
{
    lua_Integer v = luaL_checkinteger(L, arg);
    luaL_argcheck(L, v >= 0 && v < 0xffffffffLL, arg, "id must be within 0..4294967294");
    return (unsigned)v;
}

static int push_ok_or_fail(lua_State *L, const char *what, int rc)
{
    if (rc < 0) return corral_pushfail(L, what, errno);
    lua_pushboolean(L, 1);
    return 1;
}

/* core.fs.mkdir(path, mode) → true | nil, msg, errno (EEXIST when it is already there).
 * The mode is applied exactly, whatever the umask. */
static int l_mkdir(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    mode_t mode = check_mode(L, 2);
    if (mkdir(path, mode) < 0) return corral_pushfail(L, path, errno);
    return push_ok_or_fail(L, path, fchmodat(AT_FDCWD, path, mode, 0));
}

/* core.fs.chmod(path, mode) → true | nil, msg, errno. Refuses a symlink (ELOOP) rather than
 * changing what it points at. */
static int l_chmod(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    mode_t mode = check_mode(L, 2);
    int fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return corral_pushfail(L, path, errno);
    struct stat st;
    int rc = fstat(fd, &st);
    if (rc == 0 && S_ISLNK(st.st_mode)) {
        close(fd);
        return corral_pushfail(L, path, ELOOP);
    }
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    rc = rc < 0 ? rc : chmod(proc, mode);
    int err = errno;
    close(fd);
    if (rc < 0) return corral_pushfail(L, path, err);
    lua_pushboolean(L, 1);
    return 1;
}

/* core.fs.chown(path, uid, gid) → true | nil, msg, errno; a symlink itself, never its target. */
static int l_chown(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    unsigned uid = check_id(L, 2), gid = check_id(L, 3);
    return push_ok_or_fail(L, path, fchownat(AT_FDCWD, path, uid, gid, AT_SYMLINK_NOFOLLOW));
}

/* core.fs.lstat(path | fd) → {type = "dir"|"file"|"link"|"socket"|"other", uid, gid, mode, dev,
 * ino, nlink, size, allocated (bytes on disk), mtime_ns} | nil, msg, errno. Given a corral.fd, what
 * it holds (fstat): the very directory a lock or a check took, whatever its path names now. */
static int l_lstat(lua_State *L)
{
    struct stat st;
    if (luaL_testudata(L, 1, CORRAL_FD_TYPE)) {
        if (fstat(corral_checkfd(L, 1), &st) < 0) return corral_pushfail(L, "fstat", errno);
    } else {
        const char *path = corral_checkpath(L, 1);
        if (lstat(path, &st) < 0) return corral_pushfail(L, path, errno);
    }
    lua_createtable(L, 0, 10);
    lua_pushstring(L, S_ISDIR(st.st_mode)    ? "dir"
                      : S_ISREG(st.st_mode)  ? "file"
                      : S_ISLNK(st.st_mode)  ? "link"
                      : S_ISSOCK(st.st_mode) ? "socket"
                                             : "other");
    lua_setfield(L, -2, "type");
    lua_pushinteger(L, st.st_uid);
    lua_setfield(L, -2, "uid");
    lua_pushinteger(L, st.st_gid);
    lua_setfield(L, -2, "gid");
    lua_pushinteger(L, st.st_mode & 07777);
    lua_setfield(L, -2, "mode");
    lua_pushinteger(L, (lua_Integer)st.st_dev);
    lua_setfield(L, -2, "dev");
    lua_pushinteger(L, (lua_Integer)st.st_ino);
    lua_setfield(L, -2, "ino");
    lua_pushinteger(L, (lua_Integer)st.st_size);
    lua_setfield(L, -2, "size");
    lua_pushinteger(L, (lua_Integer)st.st_blocks * 512); /* what it takes on disk */
    lua_setfield(L, -2, "allocated");
    lua_pushinteger(L, (lua_Integer)st.st_nlink);
    lua_setfield(L, -2, "nlink");
    lua_pushinteger(L, (lua_Integer)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec);
    lua_setfield(L, -2, "mtime_ns");
    return 1;
}

/* core.fs.remove_tree(path) → true | nil, msg, errno. Never follows a symlink. */
static int l_remove_tree(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    int err = corral_remove_tree(path);
    if (err) return corral_pushfail(L, path, -err);
    lua_pushboolean(L, 1);
    return 1;
}

/* core.fs.access_as(path, uid, gid, how) → true | false | nil, msg, errno; how is a string
 * of "r", "w", "x" letters. */
static int l_access_as(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    unsigned uid = check_id(L, 2), gid = check_id(L, 3);
    const char *how = luaL_checkstring(L, 4);
    int mode = 0;
    for (const char *c = how; *c; c++) {
        if (*c == 'r')
            mode |= R_OK;
        else if (*c == 'w')
            mode |= W_OK;
        else if (*c == 'x')
            mode |= X_OK;
        else
            return luaL_argerror(L, 4, "expected letters r, w and x");
    }
    luaL_argcheck(L, mode != 0, 4, "expected letters r, w and x");
    int rc = corral_access_as(path, uid, gid, mode);
    if (rc < 0) return corral_pushfail(L, "access_as", -rc);
    lua_pushboolean(L, rc);
    return 1;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* core.fs.listdir(path) → {name, …} (sorted, without "." and "..") | nil, msg, errno */
static int l_listdir(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    DIR *d = opendir(path);
    if (!d) return corral_pushfail(L, path, errno);
    lua_newtable(L);
    lua_Integer n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        lua_pushstring(L, e->d_name);
        lua_rawseti(L, -2, ++n);
    }
    closedir(d);
    /* Sorted in byte order, so callers and tests see a stable order. The names are
     * sorted as pointers into the first table, which keeps them alive while the sorted
     * copy is built. */
    const char **names = lua_newuserdatauv(L, sizeof *names * (size_t)(n ? n : 1), 0);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_rawgeti(L, -2, i);
        names[i - 1] = lua_tostring(L, -1);
        lua_pop(L, 1);
    }
    qsort(names, (size_t)n, sizeof *names, compare_names);
    lua_createtable(L, (int)n, 0);
    for (lua_Integer i = 1; i <= n; i++) {
        lua_pushstring(L, names[i - 1]);
        lua_rawseti(L, -2, i);
    }
    return 1;
}

/* core.fs.lock_dir(path) → fd holding an exclusive flock on the directory | nil, msg, errno
 * (EWOULDBLOCK: another holder). The lock lasts until the fd is closed. */
static int l_lock_dir(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    corral_fd *f = corral_newfd(L); /* before the syscall: a raise cannot leak the fd */
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return corral_pushfail(L, path, errno);
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int err = errno;
        close(fd);
        return corral_pushfail(L, path, err);
    }
    f->fd = fd;
    return 1;
}

/* core.fs.open_dir(path) → fd on the directory, no symlink followed anywhere | nil, msg,
 * errno (ELOOP: a symlink on the way). */
static int l_open_dir(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    corral_fd *f = corral_newfd(L);
    int fd = corral_open_no_symlinks(AT_FDCWD, path, O_RDONLY | O_DIRECTORY, 0);
    if (fd < 0) return corral_pushfail(L, path, fd);
    f->fd = fd;
    return 1;
}

/* core.fs.open_path(path) → an O_PATH fd on the file or directory itself, no symlink
 * followed anywhere (the last component included) | nil, msg, errno (ELOOP: a symlink on
 * the way). /proc/self/fd/N then names exactly what was opened. */
static int l_open_path(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    corral_fd *f = corral_newfd(L);
    int fd = corral_open_no_symlinks(AT_FDCWD, path, O_PATH, CORRAL_OPEN_WALK);
    if (fd < 0) return corral_pushfail(L, path, fd);
    f->fd = fd;
    return 1;
}

/* core.fs.mark(fd, name) → true | nil, msg, errno (EOPNOTSUPP: the filesystem keeps no
 * such attribute); core.fs.marked(path, name) → boolean | nil, msg, errno. The mark is a
 * trusted.* extended attribute (fs.h). */
static const char *check_mark(lua_State *L, int arg)
{
    const char *name = luaL_checkstring(L, arg);
    luaL_argcheck(L, strncmp(name, "trusted.", 8) == 0, arg, "a mark is a trusted.* attribute");
    return name;
}

static int l_mark(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    int r = corral_mark_dir(fd, check_mark(L, 2));
    if (r < 0) return corral_pushfail(L, "mark", r);
    lua_pushboolean(L, 1);
    return 1;
}

static int l_marked(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    int r = corral_dir_marked(path, check_mark(L, 2));
    if (r < 0) return corral_pushfail(L, path, r);
    lua_pushboolean(L, r);
    return 1;
}

/* core.fs.statvfs(path) → {size =, available =} in bytes (available: what an unprivileged
 * writer may still take) | nil, msg, errno */
static int l_statvfs(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    struct statvfs v;
    if (statvfs(path, &v) < 0) return corral_pushfail(L, path, errno);
    lua_createtable(L, 0, 2);
    lua_pushinteger(L, (lua_Integer)(v.f_blocks * v.f_frsize));
    lua_setfield(L, -2, "size");
    lua_pushinteger(L, (lua_Integer)(v.f_bavail * v.f_frsize));
    lua_setfield(L, -2, "available");
    return 1;
}

/* core.fs.kernel_fs(path) → "proc", "sysfs" … (corral_kernel_fs) or false | nil, msg, errno */
static int l_kernel_fs(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    const char *name;
    int r = corral_kernel_fs(path, &name);
    if (r < 0) return corral_pushfail(L, path, r);
    if (name)
        lua_pushstring(L, name);
    else
        lua_pushboolean(L, 0);
    return 1;
}

/* core.fs.mkdtemp(prefix) → a new private directory (mode 0700) "<prefix>XXXXXX". */
static int l_mkdtemp(lua_State *L)
{
    const char *prefix = corral_checkpath(L, 1);
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%sXXXXXX", prefix) >= (int)sizeof buf)
        return luaL_argerror(L, 1, "prefix too long");
    if (!mkdtemp(buf)) return corral_pushfail(L, "mkdtemp", errno);
    lua_pushstring(L, buf);
    return 1;
}

static int close_stream(lua_State *L)
{
    luaL_Stream *s = (luaL_Stream *)luaL_checkudata(L, 1, LUA_FILEHANDLE);
    int ok = fclose(s->f) == 0;
    return luaL_fileresult(L, ok, NULL);
}

static const char *kind_of(mode_t m)
{
    return S_ISFIFO(m)   ? "a FIFO"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
           : S_ISDIR(m)  ? "a directory"
                         : "not a regular file";
}

/* core.fs.open_private(path [, "a" | "w"]) → a Lua file, appending ("a", the default) or
 * emptied ("w") | nil, msg, errno: see corral_open_private (ELOOP a symbolic link, ENXIO
 * a FIFO without a reader, EINVAL not a regular file, EPERM another user's file). The
 * mode is then 0600. */
static int l_open_private(lua_State *L)
{
    static const char *const modes[] = {"a", "w", NULL};
    const char *path = corral_checkpath(L, 1);
    int truncate = luaL_checkoption(L, 2, "a", modes);
    luaL_Stream *s = (luaL_Stream *)lua_newuserdatauv(L, sizeof *s, 0);
    s->f = NULL;
    s->closef = NULL; /* closed until the file is open */
    luaL_setmetatable(L, LUA_FILEHANDLE);
    struct stat st;
    int fd = corral_open_private(path, truncate, &st);
    if (fd == -EINVAL) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s: %s, not a regular file", path, kind_of(st.st_mode));
        lua_pushinteger(L, EINVAL);
        return 3;
    }
    if (fd == -EPERM) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s: owned by uid %d, not by this process's (%d)", path, (int)st.st_uid,
                        (int)geteuid());
        lua_pushinteger(L, EPERM);
        return 3;
    }
    if (fd == -ENXIO) {
        lua_pushnil(L);
        lua_pushfstring(L, "%s: a FIFO (or socket) with no reader, not a regular file", path);
        lua_pushinteger(L, ENXIO);
        return 3;
    }
    if (fd < 0) return corral_pushfail(L, path, fd);
    s->f = fdopen(fd, truncate ? "w" : "a");
    if (!s->f) {
        int err = errno;
        close(fd);
        return corral_pushfail(L, path, err);
    }
    s->closef = close_stream;
    return 1;
}

/* core.fs.readlink(path) → target, or nil, msg, errno (EINVAL: not a symlink). */
static int l_readlink(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    char buf[PATH_MAX];
    ssize_t n = readlink(path, buf, sizeof buf - 1);
    if (n < 0) return corral_pushfail(L, path, errno);
    lua_pushlstring(L, buf, (size_t)n);
    return 1;
}

/* fs.read(path) → the whole file, or nil, msg, errno. One open and read(2) to the end:
 * a /proc or /sys file costs two reads, where stdio's buffering takes several calls
 * more (the probe cache's key reads about twenty of them at every start). */
static int l_read(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return corral_pushfail(L, path, errno);
    /* Read through the stack: the kernel files read here are small, and a buffer of the
     * read's size taken from the Lua heap cost each one an allocation (and its first
     * touch). Measured: the probe cache key's 19 reads, ~40 us less in a fresh process. */
    char chunk[16384];
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int err = errno;
            close(fd);
            return corral_pushfail(L, path, err);
        }
        if (n == 0) break;
        luaL_addlstring(&b, chunk, (size_t)n);
    }
    close(fd);
    luaL_pushresult(&b);
    return 1;
}

/* fs.read_regular(path, max) → the whole file, or nil, msg, errno: a file a user names
 * (a receipt, a public key), read only when it is a regular file of at most max bytes.
 * Opened without blocking (a FIFO's open would wait for a writer) and checked on the fd
 * it is read through; a directory, a device or a FIFO is EINVAL, a larger file EFBIG
 * (never read whole: /dev/zero has no end). */
static int l_read_regular(lua_State *L)
{
    const char *path = corral_checkpath(L, 1);
    lua_Integer max = luaL_checkinteger(L, 2);
    luaL_argcheck(L, max >= 0, 2, "must be 0 or more");
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return corral_pushfail(L, path, errno);
    struct stat st;
    int err = fstat(fd, &st) < 0     ? errno
              : !S_ISREG(st.st_mode) ? EINVAL
              : st.st_size > max     ? EFBIG
                                     : 0;
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    for (lua_Integer total = 0; err == 0;) {
        char chunk[16384];
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) err = errno;
        if (n <= 0) break;
        if ((total += n) > max)
            err = EFBIG; /* it grew since the fstat */
        else
            luaL_addlstring(&b, chunk, (size_t)n);
    }
    close(fd);
    if (err == EINVAL || err == EFBIG) {
        lua_pushnil(L);
        if (err == EINVAL)
            lua_pushfstring(L, "%s: not a regular file", path);
        else
            lua_pushfstring(L, "%s: larger than %I bytes", path, max);
        lua_pushinteger(L, err);
        return 3;
    }
    if (err) return corral_pushfail(L, path, err);
    luaL_pushresult(&b);
    return 1;
}

int corral_open_fs(lua_State *L)
{
    static const luaL_Reg fns[] = {{"mkdir", l_mkdir},
                                   {"chmod", l_chmod},
                                   {"chown", l_chown},
                                   {"lstat", l_lstat},
                                   {"remove_tree", l_remove_tree},
                                   {"access_as", l_access_as},
                                   {"listdir", l_listdir},
                                   {"lock_dir", l_lock_dir},
                                   {"open_dir", l_open_dir},
                                   {"open_path", l_open_path},
                                   {"statvfs", l_statvfs},
                                   {"kernel_fs", l_kernel_fs},
                                   {"mkdtemp", l_mkdtemp},
                                   {"readlink", l_readlink},
                                   {"read", l_read},
                                   {"read_regular", l_read_regular},
                                   {"mark", l_mark},
                                   {"marked", l_marked},
                                   {"open_private", l_open_private},
                                   {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
