/*
 * core.tty.save / core.tty.restore: a terminal's settings (termios and window size) as
 * an opaque string, put back after a tenant ran on it. A tenant's fds 0-2 may be the
 * operator's terminal, and `stty -echo intr undef` from inside outlives the run.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "lcorral.h"
#include "pty.h"

struct tty_state {
    struct termios tio;
    struct winsize ws;
    int has_ws;
};

/* core.tty.save(fdnum) → state string | nil (not a terminal) */
static int l_tty_save(lua_State *L)
{
    int fd = (int)luaL_checkinteger(L, 1);
    struct tty_state st;
    memset(&st, 0, sizeof st);
    if (!isatty(fd) || tcgetattr(fd, &st.tio) < 0) {
        lua_pushnil(L);
        return 1;
    }
    st.has_ws = ioctl(fd, TIOCGWINSZ, &st.ws) == 0;
    lua_pushlstring(L, (const char *)&st, sizeof st);
    return 1;
}

/* core.tty.restore(fdnum, state) → true | nil, msg, errno */
static int l_tty_restore(lua_State *L)
{
    int fd = (int)luaL_checkinteger(L, 1);
    size_t len;
    const char *s = luaL_checklstring(L, 2, &len);
    luaL_argcheck(L, len == sizeof(struct tty_state), 2, "not a state from core.tty.save");
    struct tty_state st;
    memcpy(&st, s, sizeof st);
    if (tcsetattr(fd, TCSANOW, &st.tio) < 0) return corral_pushfail(L, "tcsetattr", errno);
    /* Exclusive mode is not in termios, and a tenant's TIOCEXCL outlives the run; corral
     * never sets it, so clearing it restores what was found. */
    ioctl(fd, TIOCNXCL);
    if (st.has_ws && ioctl(fd, TIOCSWINSZ, &st.ws) < 0)
        return corral_pushfail(L, "TIOCSWINSZ", errno);
    lua_pushboolean(L, 1);
    return 1;
}

/* core.tty.open_pty(pid[, rows, cols]) → master, slave | nil, msg, errno: a pty of the
 * devpts under process pid's root (a sandbox's init: core/lib/pty.h). The caller holds
 * pid unreaped, so it names that process. */
static int l_tty_open_pty(lua_State *L)
{
    lua_Integer pid = luaL_checkinteger(L, 1);
    lua_Integer rows = luaL_optinteger(L, 2, 0), cols = luaL_optinteger(L, 3, 0);
    luaL_argcheck(L, pid > 0 && pid <= INT_MAX, 1, "not a pid");
    luaL_argcheck(L, rows >= 0 && rows <= 65535, 2, "rows out of range 0..65535");
    luaL_argcheck(L, cols >= 0 && cols <= 65535, 3, "cols out of range 0..65535");
    char path[48];
    snprintf(path, sizeof path, "/proc/%d/root", (int)pid);
    int root = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) return corral_pushfail(L, path, errno);
    corral_fd *m = corral_newfd(L);
    corral_fd *s = corral_newfd(L);
    int r = corral_pty_open_in(root, (int)rows, (int)cols, &m->fd, &s->fd);
    close(root);
    if (r < 0) return corral_pushfail(L, "open pty", r);
    return 2;
}

int corral_open_tty(lua_State *L)
{
    static const luaL_Reg fns[] = {
        {"save", l_tty_save}, {"restore", l_tty_restore}, {"open_pty", l_tty_open_pty}, {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
