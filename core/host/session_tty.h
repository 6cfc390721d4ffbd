/*
 * `corral exec -t`'s side of a terminal: the client's own terminal set raw and restored,
 * its window size read and set on the sandbox's pty master, and the bytes relayed both
 * ways (stdin -> master, master -> stdout) from one poll loop.
 */
#ifndef CORRAL_SESSION_TTY_H
#define CORRAL_SESSION_TTY_H

#include <poll.h>
#include <termios.h>

struct session_tty {
    int master; /* the pty master the keeper sent (CLOEXEC, O_NONBLOCK); -1: none yet */
    int raw;    /* 1 while stdin is set raw (saved holds what to restore) */
    struct termios saved;
    char in[4096]; /* read from stdin, not yet written to the master */
    size_t in_len, in_off;
    int stdin_done;  /* stdin ended (its end sent as the terminal's EOF character) */
    int master_done; /* the master read end of file or EIO: no slave holder is left */
    int out_broken;  /* stdout refused a write: output is read and dropped */
};

/* The window size of the client's terminal (stdin's, else stdout's), 24x80 when neither
 * is one. */
void session_tty_size(unsigned *rows, unsigned *cols);

/* Takes the master (made non-blocking: a write never waits for the sandbox to read) and
 * sets stdin raw when it is a terminal. Returns 0 or -errno. */
int session_tty_start(struct session_tty *t, int master);

/* The client's window size set on the master (SIGWINCH). */
void session_tty_winch(struct session_tty *t);

/* Fills up to two pollfds (stdin, master) for what the relay waits on; returns how many. */
int session_tty_pollfds(struct session_tty *t, struct pollfd *p);

/* Acts on those pollfds' revents. */
void session_tty_relay(struct session_tty *t, const struct pollfd *p, int n);

/* Copies what the master still holds to stdout (the command has ended), restores the
 * terminal and closes the master. Safe to call more than once, and without a start. */
void session_tty_finish(struct session_tty *t);

#endif
