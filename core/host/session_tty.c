/*
 * The terminal side of `corral exec -t` (see session_tty.h). The master is the only fd
 * made non-blocking: a stdin or stdout the client shares with its caller keeps its
 * flags. Writes to stdout block, which only slows the command's output down (the pty
 * holds what it writes); writes to the master never block, so a command that does not
 * read its input cannot stall the relay of its output.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "session_tty.h"

static int tty_fd(void)
{
    if (isatty(STDIN_FILENO)) return STDIN_FILENO;
    if (isatty(STDOUT_FILENO)) return STDOUT_FILENO;
    return -1;
}

void session_tty_size(unsigned *rows, unsigned *cols)
{
    struct winsize ws;
    int fd = tty_fd();
    *rows = 24;
    *cols = 80;
    if (fd >= 0 && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
        *rows = ws.ws_row;
        *cols = ws.ws_col;
    }
}

int session_tty_start(struct session_tty *t, int master)
{
    int flags = fcntl(master, F_GETFL);
    if (flags < 0 || fcntl(master, F_SETFL, flags | O_NONBLOCK) < 0) return -errno;
    t->master = master;
    if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &t->saved) == 0) {
        struct termios raw = t->saved;
        cfmakeraw(&raw);
        if (tcsetattr(STDIN_FILENO, TCSADRAIN, &raw) == 0) t->raw = 1;
    }
    return 0;
}

void session_tty_winch(struct session_tty *t)
{
    struct winsize ws;
    int fd = tty_fd();
    if (t->master >= 0 && fd >= 0 && ioctl(fd, TIOCGWINSZ, &ws) == 0)
        ioctl(t->master, TIOCSWINSZ, &ws);
}

static void write_out(struct session_tty *t, const char *buf, size_t len)
{
    while (len > 0 && !t->out_broken) {
        ssize_t n = write(STDOUT_FILENO, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            t->out_broken = 1;
            return;
        }
        buf += n;
        len -= (size_t)n;
    }
}

/* One read of the master to stdout; 0 when nothing was there (or no more will come). */
static int master_to_out(struct session_tty *t)
{
    char buf[4096];
    ssize_t n = read(t->master, buf, sizeof buf);
    if (n > 0) {
        write_out(t, buf, (size_t)n);
        return 1;
    }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) t->master_done = 1; /* EIO: slave gone */
    return 0;
}

static void stdin_to_buffer(struct session_tty *t)
{
    ssize_t n = read(STDIN_FILENO, t->in, sizeof t->in);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
        /* the command reads the end of input as a terminal gives it: its EOF character */
        struct termios tio;
        t->in[0] = tcgetattr(t->master, &tio) == 0 ? (char)tio.c_cc[VEOF] : '\x04';
        n = 1;
        t->stdin_done = 1;
    }
    t->in_len = (size_t)n;
    t->in_off = 0;
}

static void buffer_to_master(struct session_tty *t)
{
    ssize_t n = write(t->master, t->in + t->in_off, t->in_len - t->in_off);
    if (n > 0)
        t->in_off += (size_t)n;
    else if (n < 0 && errno != EAGAIN && errno != EINTR)
        t->in_off = t->in_len; /* dropped */
    if (t->in_off == t->in_len) t->in_len = t->in_off = 0;
}

int session_tty_pollfds(struct session_tty *t, struct pollfd *p)
{
    int n = 0;
    if (t->master < 0) return 0;
    if (!t->stdin_done && t->in_len == 0) p[n++] = (struct pollfd){STDIN_FILENO, POLLIN, 0};
    if (!t->master_done)
        p[n++] = (struct pollfd){t->master, (short)(POLLIN | (t->in_len ? POLLOUT : 0)), 0};
    return n;
}

void session_tty_relay(struct session_tty *t, const struct pollfd *p, int n)
{
    for (int i = 0; i < n; i++) {
        if (p[i].revents == 0) continue;
        if (p[i].fd == STDIN_FILENO) {
            stdin_to_buffer(t);
            continue;
        }
        if (p[i].revents & POLLOUT) buffer_to_master(t);
        if (p[i].revents & (POLLIN | POLLHUP | POLLERR)) master_to_out(t);
    }
}

void session_tty_finish(struct session_tty *t)
{
    if (t->master >= 0) {
        while (!t->master_done && master_to_out(t))
            ;
        close(t->master);
        t->master = -1;
    }
    if (t->raw) {
        tcsetattr(STDIN_FILENO, TCSADRAIN, &t->saved);
        t->raw = 0;
    }
}
