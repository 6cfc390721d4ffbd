/*
 * Namespace primitives: namespace fds of a process, entering and leaving namespaces,
 * comparing them, writing a child user namespace's id maps, and running a step (making
 * a socket) inside another network namespace without moving the calling thread.
 */
#ifndef CORRAL_NS_H
#define CORRAL_NS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The CLONE_NEW* flag for a kind name ("user", "mnt", "pid", "net", "ipc", "uts",
 * "cgroup", "time"), or -EINVAL. */
int corral_ns_type(const char *kind);

const char *corral_ns_kind(int nstype);

/* Opens /proc/PID/ns/KIND (pid 0: the calling process) O_RDONLY|O_CLOEXEC. Returns the
 * fd or -errno (-EINVAL for an unknown kind). */
int corral_ns_open(pid_t pid, const char *kind);

/* setns(fd, nstype) (nstype 0 accepts any kind) and unshare(flags): 0 or -errno. */
int corral_ns_setns(int fd, int nstype);
int corral_ns_unshare(int flags);

struct corral_ns_info {
    int nstype;   /* CLONE_NEW* from the NS_GET_NSTYPE ioctl */
    uint64_t ino; /* with dev, identifies the namespace */
    uint64_t dev;
};

/* Describes a namespace fd. Returns 0 or -errno (-ENOTTY: not a namespace fd). */
int corral_ns_info(int fd, struct corral_ns_info *out);

/* 1 when both fds name the same namespace, 0 when not, or -errno. */
int corral_ns_same(int fd1, int fd2);

/* One line of a uid_map or gid_map. */
struct corral_id_map {
    uint32_t inside;
    uint32_t outside;
    uint32_t count;
};

/* Writes /proc/PID/uid_map and /proc/PID/gid_map for a process in a new user namespace
 * (pid 0: the calling process; an empty list leaves that map alone). A gid_map refused
 * with EPERM (no CAP_SETGID over the parent namespace) is retried once after "deny" is
 * written to /proc/PID/setgroups: the one case where an unprivileged writer may map its
 * own gid. Returns 0 or -errno (-EINVAL for an empty range, or a map longer than the
 * kernel accepts in its single write). */
int corral_ns_write_maps(pid_t pid, const struct corral_id_map *uid, size_t nuid,
                         const struct corral_id_map *gid, size_t ngid);

/* A new, empty network namespace owned by the caller's user namespace, held only by the
 * returned CLOEXEC fd (it disappears when the last fd and process let go). Made on a
 * short-lived thread, so the calling thread never changes namespace. Returns the fd or
 * -errno. */
int corral_ns_new_net(void);

/* A network namespace made by an unprivileged caller (docs/architecture.md, invariant 4):
 * a new user namespace owned by the caller, mapping only its own uid and gid (to
 * themselves), and a new, empty netns owned by that user namespace, held only by the
 * returned CLOEXEC fd (the user namespace lives as long as the netns). The caller holds
 * every capability over both, without ever entering them; a tenant whose own user
 * namespace is made beneath that one holds none over the netns. Made on a child process
 * (see corral_ns_run_in), so the caller never changes namespace. The caller must be
 * dumpable, as a process its uid started is: the maps are written through its own
 * /proc/self files. Returns the fd or -errno (-EPERM, -ENOSPC: user namespaces refused,
 * or their count exhausted; -EACCES: a non-dumpable caller). */
int corral_ns_new_net_in_userns(void);

/* The user namespace owning the namespace ns_fd when it is not the caller's own:
 * *foreign receives a new CLOEXEC fd on it (NS_GET_USERNS), or -1 when the owner is the
 * caller's own user namespace, or cannot be named (an fd that is not a namespace, an
 * owner beyond the caller's scope). Returns 0 or -errno. */
int corral_ns_owner(int ns_fd, int *foreign);

/*
 * Runs fn(arg) inside the network namespace netns_fd with every signal blocked, and
 * returns what fn returned, or -errno when the netns could not be entered (-EBADF for a
 * negative fd, -EINVAL for an fd that is not a network namespace). A socket belongs for
 * life to the netns it was created in: so a socket fn creates lives in netns_fd while
 * the caller never changes namespace. fn must only make its object and return.
 *
 * The calling thread's own netns needs no entering: fn runs on it (entering it would
 * need CAP_SYS_ADMIN all the same). Another netns owned by the caller's own user
 * namespace is entered by a short-lived thread
 * (setns moves only the calling thread). One owned by another user namespace (as
 * corral_ns_new_net_in_userns makes) can only be entered from inside its owner, and only
 * a process alone in its thread group may enter a user namespace: fn then runs on a
 * child process sharing the caller's memory and fd table (CLONE_VM | CLONE_FILES |
 * CLONE_VFORK), which joins the owner and then the netns. Either way fn writes to arg
 * and opens fds as the caller would.
 */
int corral_ns_run_in(int netns_fd, int (*fn)(void *), void *arg);

/*
 * Runs fn(arg) on a child process that shares the caller's memory and fd table
 * (CLONE_VM | CLONE_FILES) but is a thread group of its own: the kernel lets only a
 * process alone in its thread group enter or create a user namespace (setns(2),
 * unshare(2)), which a thread of a threaded host never is. CLONE_VFORK suspends the
 * calling thread until the child has exited, so fn runs as the caller would, on a stack
 * of its own (1 MiB), with every signal blocked: what it writes to arg and the fds it
 * opens are the caller's; its credentials and namespaces are its own and end with it.
 * exit_signal is the signal its exit sends (0: none, so a host loop waiting for SIGCHLD
 * never sees it; a clone3 with CLONE_PARENT made by fn inherits it). Reaped here.
 * Returns 0 once fn has returned (its result is whatever it wrote to arg), or -errno.
 */
int corral_ns_run_in_child(int (*fn)(void *), void *arg, int exit_signal);

/* 1 when socket sock_fd belongs to the netns netns_fd (SIOCGSKNS), 0 when it does not,
 * or -errno. */
int corral_ns_socket_is(int sock_fd, int netns_fd);

/*
 * socket(domain, type | SOCK_CLOEXEC, protocol) created inside the netns netns_fd (there
 * is no "current netns" value), checked with corral_ns_socket_is before it is returned.
 * Returns the fd or -errno: -EINVAL (or -EBADF) when the netns cannot be entered, -EXDEV
 * when the socket turns out not to belong to it. There is no fallback: a netns that
 * cannot be entered gives an error, never a socket in the caller's own netns.
 */
int corral_ns_socket(int netns_fd, int domain, int type, int protocol);

#endif
