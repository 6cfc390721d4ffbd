/*
 * `corral exec` (see session_exec.h): parse, find the keeper's socket by the runtime
 * directory rule (core/lib/rundir.c), send the request with fds 0-2 in one message (or
 * none with -t: the keeper answers with a pty's master), then wait on the socket, the
 * forwarded signals and, with -t, the terminal relay (session_tty.c) until the keeper
 * says how the command ended.
 *
 * A program of its own that prints its one diagnostic line and exits, as the
 * confinement wrapper is (core/host/confine.c); core/lib never does either.
 */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "exitcodes.h"
#include "jsontext.h"
#include "rundir.h"
#include "session_exec.h"
#include "session_tty.h"
#include "session_wire.h"
#include "unix.h"

#define PROG "corral exec"
#define USAGE_HINT "usage: corral exec ID [--env NAME[=VALUE]]... [--cwd DIR] [-t] -- CMD ARGS..."
/* An answer line longer than this is no answer of the protocol. */
#define ANSWER_MAX 65536
/* A keeper that accepts no connection within this long is taken as not there. */
#define CONNECT_TIMEOUT_MS 5000

struct exec_args {
    const char *id;
    char **names, **values; /* nenv pairs, each name once (a later --env replaces) */
    int nenv;
    const char *cwd;
    int tty;
    char **cmd;
    int ncmd;
};

static int usage_error(const char *what, const char *detail)
{
    fprintf(stderr, PROG ": invalid_argument: %s: %s\n", what, detail);
    return CORRAL_EXIT_USAGE;
}

int corral_session_exec_wants_help(int argc, char **argv)
{
    int operands = 0;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return 1;
        if (strcmp(a, "--env") == 0 || strcmp(a, "--cwd") == 0)
            i++; /* its value */
        else if (a[0] != '-' && ++operands == 2)
            return 0; /* the command */
    }
    return 0;
}

static int env_name_valid(const char *s, size_t n)
{
    if (n == 0 || (s[0] >= '0' && s[0] <= '9')) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return 0;
    }
    return 1;
}

/* --env NAME (its value from this environment) or NAME=VALUE. */
static int add_env(struct exec_args *a, const char *spec)
{
    const char *eq = strchr(spec, '=');
    size_t n = eq ? (size_t)(eq - spec) : strlen(spec);
    if (!env_name_valid(spec, n))
        return usage_error("--env", "wants NAME or NAME=VALUE, NAME of letters, digits and _ "
                                    "not starting with a digit");
    char *name = strndup(spec, n);
    if (name == NULL) return usage_error("--env", "out of memory");
    const char *value = eq ? eq + 1 : getenv(name);
    if (value == NULL) {
        fprintf(stderr, PROG ": invalid_argument: --env: %s is not set here (give %s=VALUE)\n",
                name, name);
        free(name);
        return CORRAL_EXIT_USAGE;
    }
    int i = 0;
    while (i < a->nenv && strcmp(a->names[i], name) != 0)
        i++;
    if (i == a->nenv)
        a->nenv++;
    else
        free(a->names[i]);
    a->names[i] = name;
    a->values[i] = (char *)value;
    return 0;
}

/* The value of the option at argv[*i] (inline after '=', else the next word). */
static const char *option_value(int argc, char **argv, int *i, const char *inline_value)
{
    if (inline_value) return inline_value;
    if (*i + 1 >= argc || strcmp(argv[*i + 1], "--") == 0) return NULL;
    return argv[++*i];
}

static int parse_option(struct exec_args *a, int argc, char **argv, int *i)
{
    const char *arg = argv[*i];
    if (strcmp(arg, "-t") == 0) {
        a->tty = 1;
        return 0;
    }
    if (strncmp(arg, "--", 2) != 0)
        return usage_error(arg, "unknown option (options are --env, "
                                "--cwd, -t/--tty; a command goes after --)");
    char name[16];
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    if (n >= sizeof name) n = sizeof name - 1;
    memcpy(name, arg, n);
    name[n] = '\0';
    const char *inline_value = eq ? eq + 1 : NULL;
    if (strcmp(name, "--tty") == 0) {
        if (inline_value) return usage_error("--tty", "takes no value");
        a->tty = 1;
        return 0;
    }
    if (strcmp(name, "--env") != 0 && strcmp(name, "--cwd") != 0)
        return usage_error(arg, "unknown option (options are --env, --cwd, -t/--tty)");
    const char *v = option_value(argc, argv, i, inline_value);
    if (v == NULL) return usage_error(name, "needs a value");
    if (strcmp(name, "--env") == 0) return add_env(a, v);
    if (a->cwd) return usage_error("--cwd", "given twice");
    if (v[0] != '/') return usage_error("--cwd", "must be an absolute path in the sandbox");
    a->cwd = v;
    return 0;
}

static int parse_args(struct exec_args *a, int argc, char **argv)
{
    a->names = calloc((size_t)argc, sizeof *a->names);
    a->values = calloc((size_t)argc, sizeof *a->values);
    if (!a->names || !a->values) return usage_error("arguments", "out of memory");
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--") == 0) {
            a->cmd = argv + i + 1;
            a->ncmd = argc - i - 1;
            break;
        }
        if (arg[0] == '-' && arg[1] != '\0') {
            int r = parse_option(a, argc, argv, &i);
            if (r) return r;
        } else if (a->id == NULL) {
            a->id = arg;
        } else { /* the command, when no -- came before it */
            a->cmd = argv + i;
            a->ncmd = argc - i;
            break;
        }
    }
    if (a->id == NULL) return usage_error("ID", "missing; " USAGE_HINT);
    if (!corral_session_id_valid(a->id))
        return usage_error("ID", "not a sandbox id (a letter or digit, then letters, digits, "
                                 "_ . -; at most 63; no '..')");
    if (a->ncmd == 0) return usage_error("the command", "missing after --; " USAGE_HINT);
    return 0;
}

static void free_args(struct exec_args *a)
{
    for (int i = 0; i < a->nenv; i++)
        free(a->names[i]);
    free(a->names);
    free(a->values);
}

static int no_keeper(const char *id)
{
    fprintf(stderr, PROG ": no live sandbox %s (corral ls lists this user's)\n", id);
    return CORRAL_EXIT_USAGE;
}

/* The keeper's socket connected, or an exit status (< 0, negated) and its line said. */
static int connect_keeper(const char *id)
{
    char dir[4096], path[4096];
    uid_t me = geteuid();
    if (corral_rundir_path(dir, sizeof dir, me, getenv("XDG_RUNTIME_DIR")) < 0)
        return -no_keeper(id);
    int r = corral_rundir_check(dir, me);
    if (r == -ENOENT) return -no_keeper(id);
    if (r < 0) {
        const char *why = r == -EPERM    ? "owned by another user"
                          : r == -EACCES ? "its mode lets others in"
                                         : strerror(-r);
        fprintf(stderr,
                PROG ": runtime directory %s: %s; refused (a socket there could be "
                     "anyone's)\n",
                dir, why);
        return -CORRAL_EXIT_USAGE;
    }
    if (corral_session_socket_path(path, sizeof path, dir, id) < 0) {
        fprintf(stderr, PROG ": %s/session-%s.sock: path too long for a socket\n", dir, id);
        return -CORRAL_EXIT_USAGE;
    }
    int fd = corral_unix_connect(path, CONNECT_TIMEOUT_MS);
    if (fd == -ENOENT || fd == -ECONNREFUSED || fd == -ETIMEDOUT) return -no_keeper(id);
    if (fd < 0) {
        fprintf(stderr, PROG ": %s: %s\n", path, strerror(-fd));
        return -CORRAL_EXIT_USAGE;
    }
    return fd;
}

/* The request as one message, fds 0-2 riding with its first bytes unless tty. */
static int send_request(int sock, const struct exec_args *a)
{
    struct corral_exec_request req = {a->cmd, a->ncmd, a->names, a->values, a->nenv,
                                      a->cwd, a->tty,  0,        0,         getenv("TERM")};
    if (!a->tty) req.term = NULL;
    session_tty_size(&req.rows, &req.cols);
    struct corral_textbuf line = {0};
    corral_session_exec_line(&line, &req);
    if (line.failed) {
        corral_textbuf_free(&line);
        return -ENOMEM;
    }
    if (line.len > CORRAL_SESSION_REQUEST_MAX) {
        fprintf(stderr,
                PROG ": invalid_argument: CMD: the command, --env and --cwd take %zu bytes as a "
                     "request; a keeper reads at most %d\n",
                line.len, CORRAL_SESSION_REQUEST_MAX);
        corral_textbuf_free(&line);
        return -E2BIG;
    }
    static const int std_fds[3] = {STDIN_FILENO, STDOUT_FILENO, STDERR_FILENO};
    ssize_t n = corral_unix_send_fds(sock, line.data, line.len, std_fds, a->tty ? 0 : 3);
    int err = n < 0 ? (int)n : 0;
    for (size_t off = n > 0 ? (size_t)n : 0; err == 0 && off < line.len;) {
        n = send(sock, line.data + off, line.len - off, MSG_NOSIGNAL);
        if (n > 0)
            off += (size_t)n;
        else if (errno != EINTR)
            err = -errno;
    }
    corral_textbuf_free(&line);
    return err;
}

struct session {
    const char *id;
    int sock, sigfd;
    int tty, started;
    struct session_tty term;
    char buf[ANSWER_MAX];
    size_t len;
};

static void forward_signal(struct session *s, int sig)
{
    char line[64];
    int n = corral_session_signal_line(line, sizeof line, sig);
    if (n > 0) send(s->sock, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* The signals that came: forwarded once the command has started; before that, one ends
 * the exec (the exit status of that signal), as it would any command still starting:
 * the connection closes, and a command the keeper starts meanwhile is killed with its
 * tree (docs/sessions.md). -1 to go on, else the exit status. */
static int read_signals(struct session *s)
{
    struct signalfd_siginfo si;
    while (read(s->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGWINCH) {
            if (s->started) session_tty_winch(&s->term);
        } else if (s->started) {
            forward_signal(s, (int)si.ssi_signo);
        } else {
            fprintf(stderr,
                    PROG ": signal %d arrived before the keeper of %s started the command\n",
                    (int)si.ssi_signo, s->id);
            return 128 + (int)si.ssi_signo;
        }
    }
    return -1;
}

static int protocol_error(struct session *s, const char *what)
{
    fprintf(stderr, PROG ": the keeper of %s %s\n", s->id, what);
    return 1;
}

/* The request could not be sent: a keeper that went away meanwhile (killed) started
 * nothing, which is 120 as for a keeper that closed without an answer. */
static int request_unsent(struct session *s, int err)
{
    if (err != EPIPE && err != ECONNRESET && err != ENOTCONN)
        return protocol_error(s, "took no request");
    fprintf(stderr, PROG ": the keeper of %s closed the connection before it took the request\n",
            s->id);
    return CORRAL_EXIT_START_REFUSED;
}

/* One answer line: -1 to go on, else the exit status. */
static int on_answer(struct session *s, const char *line, size_t len, int *master)
{
    struct corral_session_answer a;
    if (corral_session_answer_parse(line, len, &a) < 0)
        return protocol_error(s, "answered a line corral exec cannot read");
    switch (a.kind) {
    case CORRAL_ANSWER_REFUSED:
        fprintf(stderr, PROG ": %s\n", a.error);
        free(a.error);
        return s->started ? protocol_error(s, "refused a command it had started") : a.status;
    case CORRAL_ANSWER_STARTED:
        if (s->started) return protocol_error(s, "said twice that the command started");
        if (s->tty && *master < 0) return protocol_error(s, "sent no terminal with -t");
        if (s->tty && session_tty_start(&s->term, *master) < 0)
            return protocol_error(s, "sent a terminal that cannot be used");
        *master = -1; /* the terminal's own now */
        s->started = 1;
        return -1;
    case CORRAL_ANSWER_ENDED:
        if (!s->started) return protocol_error(s, "ended a command it never started");
        return a.exit;
    }
    return 1;
}

/* What the socket holds: -1 to go on, else the exit status. */
static int read_answers(struct session *s)
{
    int fds[CORRAL_UNIX_FDS_MAX], master = -1, status = -1;
    size_t nfds = 0;
    ssize_t n = corral_unix_recv_fds(s->sock, s->buf + s->len, sizeof s->buf - s->len, fds,
                                     CORRAL_UNIX_FDS_MAX, &nfds, 1);
    if (n == -EAGAIN) return -1;
    if (n <= 0) {
        /* The sandbox dies with its keeper (its init's parent-death signal ends the pid
         * namespace), so the command was SIGKILLed: its status says so, as a shell's would. */
        if (s->started) {
            protocol_error(s, "went away before the command ended (killed with its sandbox)");
            return 128 + SIGKILL;
        }
        fprintf(stderr, PROG ": the keeper of %s closed the connection without an answer\n", s->id);
        return CORRAL_EXIT_START_REFUSED;
    }
    for (size_t i = 0; i < nfds; i++) {
        if (s->tty && !s->started && master < 0)
            master = fds[i];
        else
            close(fds[i]);
    }
    s->len += (size_t)n;
    char *nl;
    while (status < 0 && (nl = memchr(s->buf, '\n', s->len)) != NULL) {
        size_t line = (size_t)(nl - s->buf);
        status = on_answer(s, s->buf, line, &master);
        memmove(s->buf, nl + 1, s->len - line - 1);
        s->len -= line + 1;
    }
    if (master >= 0) close(master);
    if (status < 0 && s->len == sizeof s->buf) return protocol_error(s, "sent an overlong line");
    return status;
}

/* Polls the socket, then (once the command started) the signals and the terminal. */
static int serve(struct session *s)
{
    for (;;) {
        struct pollfd p[4];
        int n = 0;
        p[n++] = (struct pollfd){s->sock, POLLIN, 0};
        p[n++] = (struct pollfd){s->sigfd, POLLIN, 0};
        int relay = n;
        if (s->started) n += session_tty_pollfds(&s->term, p + n);
        if (poll(p, (nfds_t)n, -1) < 0) {
            if (errno == EINTR) continue;
            return protocol_error(s, "could not be waited on");
        }
        if (s->started) session_tty_relay(&s->term, p + relay, n - relay);
        if (p[1].revents) {
            int status = read_signals(s);
            if (status >= 0) return status;
        }
        if (p[0].revents) {
            int status = read_answers(s);
            if (status >= 0) return status;
        }
    }
}

static int forwarded_signals(sigset_t *set, int tty)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    sigemptyset(set);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaddset(set, sigs[i]);
    if (tty) sigaddset(set, SIGWINCH);
    if (sigprocmask(SIG_BLOCK, set, NULL) < 0) return -errno;
    int fd = signalfd(-1, set, SFD_CLOEXEC | SFD_NONBLOCK);
    return fd < 0 ? -errno : fd;
}

static int run_session(const struct exec_args *a)
{
    /* The process's one session, static and zero from the start (not cleared here: that
     * would touch every page of its buffer): a 64 KiB allocation is an mmap and munmap
     * of its own under musl, on a path that is a few syscalls of work. */
    static struct session one;
    struct session *s = &one;
    s->id = a->id;
    s->tty = a->tty;
    s->term.master = -1;
    s->sock = -1;
    sigset_t set;
    /* blocked before the connection exists: a signal meanwhile waits to be forwarded */
    s->sigfd = forwarded_signals(&set, a->tty);
    int status;
    if (s->sigfd < 0) {
        status = protocol_error(s, "could not have signals forwarded to it");
    } else if ((s->sock = connect_keeper(a->id)) < 0) {
        status = -s->sock;
        s->sock = -1;
    } else if ((status = send_request(s->sock, a)) < 0) {
        status = status == -E2BIG ? CORRAL_EXIT_USAGE : request_unsent(s, -status);
    } else {
        status = serve(s);
    }
    session_tty_finish(&s->term);
    if (s->sock >= 0) close(s->sock);
    if (s->sigfd >= 0) close(s->sigfd);
    return status;
}

int corral_session_exec_main(int argc, char **argv)
{
    struct exec_args a = {0};
    signal(SIGPIPE, SIG_IGN);
    int status = parse_args(&a, argc, argv);
    if (status == 0) status = run_session(&a);
    free_args(&a);
    return status;
}
