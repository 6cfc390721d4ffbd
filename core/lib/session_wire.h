/*
 * The session socket's `exec` exchange as text, both directions (the protocol is
 * docs/sessions.md's wire protocol): a sandbox id checked, the socket path a
 * keeper binds, the request line a client sends, the signal line, and the three answer
 * shapes read back (refused, started, ended). Pure: no socket is touched here.
 */
#ifndef CORRAL_SESSION_WIRE_H
#define CORRAL_SESSION_WIRE_H

#include <stddef.h>

#include "jsontext.h"

/* 1 when id matches ^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$, else 0. */
int corral_session_id_valid(const char *id);

/* "<rundir>/session-<id>.sock" into out (cap bytes). Returns 0, or -ENAMETOOLONG when
 * it does not fit out or a unix socket address (sun_path). */
int corral_session_socket_path(char *out, size_t cap, const char *rundir, const char *id);

struct corral_exec_request {
    char *const *argv; /* argc strings, argc >= 1 */
    int argc;
    char *const *env_names, *const *env_values; /* nenv pairs, sent in this order */
    int nenv;
    const char *cwd; /* NULL: null */
    int tty;         /* 0 or 1 */
    unsigned rows, cols;
    const char *term; /* NULL: null */
};

/* Appends the request's one line, '\n' included. The caller checks b->failed. */
void corral_session_exec_line(struct corral_textbuf *b, const struct corral_exec_request *r);

/* The longest request line a keeper reads (corral.control's LINE_MAX), its newline
 * included: an exec whose command and --env take more is refused before it is sent. */
#define CORRAL_SESSION_REQUEST_MAX 65536

/* {"op":"signal","signal":sig}\n into out (cap bytes). Returns its length, or
 * -ENAMETOOLONG when it does not fit. */
int corral_session_signal_line(char *out, size_t cap, int sig);

enum corral_session_answer_kind {
    CORRAL_ANSWER_REFUSED, /* error, status */
    CORRAL_ANSWER_STARTED, /* pid */
    CORRAL_ANSWER_ENDED,   /* exit */
};

struct corral_session_answer {
    enum corral_session_answer_kind kind;
    char *error; /* REFUSED: malloc'd text, the caller frees it */
    int status;  /* REFUSED: 1-255 */
    long long pid;
    int exit; /* ENDED: 0-255 */
};

/* Reads one answer line (without its '\n'). Members are found wherever they stand and
 * unknown ones are ignored; a line of no known shape, a status or exit outside 0-255 or a
 * pid below 1 is -EINVAL. Returns 0, -EINVAL or -ENOMEM. */
int corral_session_answer_parse(const char *line, size_t len, struct corral_session_answer *a);

#endif
