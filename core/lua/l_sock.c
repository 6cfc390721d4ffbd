/*
 * TCP sockets (core/lib/sock.h). Failures: nil, "what: strerror", errno; bad arguments
 * raise.
 *
 *   core.sock.listen(addr[, port])                 -> fd, port
 *   core.sock.connect(addr, port[, timeout_s])     -> fd
 *   core.sock.accept(fd[, timeout_s])              -> fd
 *   core.sock.original_dst(fd)                         -> ip, port (IPv6 without brackets)
 *   core.sock.connect_marked(ip, port, mark[, timeout_s[, netns_fd]]) -> fd
 *       (mark 0: none; a mark that cannot be set fails "setsockopt_mark: …", no fd)
 *   core.sock.reset(fd)                                -> true (fd closed with an RST)
 *   core.sock.send(fd, data)                      -> bytes sent
 *   core.sock.recv(fd, max[, timeout_s])          -> data ("" at end of stream)
 *   core.sock.shutdown(fd, "r" | "w" | "rw")      -> true
 */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <netinet/in.h>

#include "lcorral.h"
#include "sock.h"

static int l_listen(lua_State *L)
{
    const char *addr = luaL_checkstring(L, 1);
    int port = (int)luaL_optinteger(L, 2, 0);
    corral_fd *f = corral_newfd(L);
    int bound = 0;
    int fd = corral_tcp_listen(addr, port, &bound);
    if (fd < 0) return corral_pushfail(L, "listen", fd);
    f->fd = fd;
    lua_pushinteger(L, bound);
    return 2;
}

static int timeout_ms(lua_State *L, int arg, double def)
{
    double s = luaL_optnumber(L, arg, def);
    return s < 0 ? -1 : (int)(s * 1000);
}

static int l_connect(lua_State *L)
{
    const char *addr = luaL_checkstring(L, 1);
    int port = (int)luaL_checkinteger(L, 2);
    int ms = timeout_ms(L, 3, 5);
    corral_fd *f = corral_newfd(L);
    int fd = corral_tcp_connect(addr, port, ms);
    if (fd < 0) return corral_pushfail(L, "connect", fd);
    f->fd = fd;
    return 1;
}

static int l_accept(lua_State *L)
{
    int lfd = corral_checkfd(L, 1);
    int ms = timeout_ms(L, 2, 5);
    corral_fd *f = corral_newfd(L);
    int fd = corral_tcp_accept(lfd, ms);
    if (fd < 0) return corral_pushfail(L, "accept", fd);
    f->fd = fd;
    return 1;
}

static int l_original_dst(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    struct sockaddr_storage ss;
    char ip[INET6_ADDRSTRLEN];
    int port = 0;
    int err = corral_original_dst(fd, &ss);
    if (err == 0) err = corral_sockaddr_text(&ss, ip, sizeof ip, &port);
    if (err < 0) return corral_pushfail(L, "original_dst", err);
    lua_pushstring(L, ip);
    lua_pushinteger(L, port);
    return 2;
}

static int l_connect_marked(lua_State *L)
{
    const char *ip = luaL_checkstring(L, 1);
    lua_Integer port = luaL_checkinteger(L, 2);
    lua_Integer mark = luaL_checkinteger(L, 3);
    int ms = timeout_ms(L, 4, 5);
    int ns = lua_isnoneornil(L, 5) ? -1 : corral_checkfd(L, 5);
    struct sockaddr_storage ss;
    socklen_t len;
    if (port < 1 || port > 65535) return luaL_argerror(L, 2, "port out of range");
    if (mark < 0 || mark > UINT32_MAX) return luaL_argerror(L, 3, "mark out of range");
    if (corral_sockaddr_from(ip, (int)port, &ss, &len) < 0)
        return luaL_argerror(L, 1, "not a numeric IPv4 or IPv6 address");
    corral_fd *f = corral_newfd(L);
    const char *what = "connect";
    int fd = corral_connect_marked_ex((struct sockaddr *)&ss, len, (uint32_t)mark, ms, ns, &what);
    if (fd < 0) return corral_pushfail(L, strcmp(what, "timeout") == 0 ? "connect" : what, fd);
    f->fd = fd;
    return 1;
}

static int l_reset(lua_State *L)
{
    corral_fd *f = (corral_fd *)luaL_checkudata(L, 1, CORRAL_FD_TYPE);
    if (f->fd < 0) return corral_pushfail(L, "reset", EBADF);
    int fd = f->fd;
    f->fd = -1;
    int err = corral_reset(fd);
    return corral_result(L, err, "reset");
}

static int l_send(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    size_t len;
    const char *data = luaL_checklstring(L, 2, &len);
    ssize_t n;
    do
        n = send(fd, data, len, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0) return corral_pushfail(L, "send", errno);
    lua_pushinteger(L, n);
    return 1;
}

static int l_recv(lua_State *L)
{
    int fd = corral_checkfd(L, 1);
    lua_Integer max = luaL_checkinteger(L, 2);
    int ms = timeout_ms(L, 3, 5);
    if (max < 1 || max > (1 << 24)) return luaL_argerror(L, 2, "max out of range 1..16 MiB");
    struct pollfd p = {.fd = fd, .events = POLLIN, .revents = 0};
    int r;
    do
        r = poll(&p, 1, ms);
    while (r < 0 && errno == EINTR);
    if (r < 0) return corral_pushfail(L, "recv", errno);
    if (r == 0) return corral_pushfail(L, "recv", ETIMEDOUT);
    luaL_Buffer b;
    char *buf = luaL_buffinitsize(L, &b, (size_t)max);
    ssize_t n;
    do
        n = recv(fd, buf, (size_t)max, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) return corral_pushfail(L, "recv", errno);
    luaL_pushresultsize(&b, (size_t)n);
    return 1;
}

static int l_shutdown(lua_State *L)
{
    static const char *const hows[] = {"r", "w", "rw", NULL};
    static const int values[] = {SHUT_RD, SHUT_WR, SHUT_RDWR};
    int fd = corral_checkfd(L, 1);
    int how = luaL_checkoption(L, 2, NULL, hows);
    if (shutdown(fd, values[how]) < 0) return corral_pushfail(L, "shutdown", errno);
    lua_pushboolean(L, 1);
    return 1;
}

int corral_open_sock(lua_State *L)
{
    static const luaL_Reg fns[] = {{"listen", l_listen},
                                   {"connect", l_connect},
                                   {"accept", l_accept},
                                   {"original_dst", l_original_dst},
                                   {"connect_marked", l_connect_marked},
                                   {"reset", l_reset},
                                   {"send", l_send},
                                   {"recv", l_recv},
                                   {"shutdown", l_shutdown},
                                   {NULL, NULL}};
    luaL_setfuncs(L, fns, 0);
    return 0;
}
