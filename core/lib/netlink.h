/*
 * Netlink sockets in another network namespace, whatever their bus (NETLINK_ROUTE for
 * rtnl.c, NETLINK_NETFILTER for nft.c), and one request's exchange on them.
 *
 * The socket is created on a short-lived thread that setns()es into the target and
 * exits (corral_ns_run_in); a netlink socket stays bound to the netns it was created in,
 * so the calling thread never changes namespace. All functions return 0 (or a value) or
 * -errno.
 */
#ifndef CORRAL_NETLINK_H
#define CORRAL_NETLINK_H

#include <libmnl/libmnl.h>

/* A netlink socket closed at the end of its scope (core/lib only, see util.h). */
static inline void corral_netlink_closep(struct mnl_socket **nl)
{
    if (*nl) mnl_socket_close(*nl);
}
#define _cleanup_nl_ __attribute__((cleanup(corral_netlink_closep)))

/*
 * Opens a netlink socket of protocol `bus` (NETLINK_ROUTE, NETLINK_NETFILTER, …) inside
 * the netns `netns_fd`, bound with an automatic port id, CLOEXEC. Before returning it
 * checks (SIOCGSKNS) that the socket belongs to that netns. *out is set only on success.
 */
int corral_netlink_open_in(int netns_fd, int bus, struct mnl_socket **out);

/*
 * Sends one request (its nlmsg_seq is assigned here) and reads replies until the ack or
 * the end of a dump; `cb` (may be NULL) sees every data message. A callback that returns
 * MNL_CB_ERROR must set errno. An interrupted dump (NLM_F_DUMP_INTR) returns -EINTR and
 * leaves the socket unusable for further requests.
 */
int corral_netlink_talk(struct mnl_socket *nl, struct nlmsghdr *nlh, mnl_cb_t cb, void *data);

/* Opens `path` read-only and CLOEXEC and checks that it is a network namespace (-EINVAL if
 * not). Returns the fd. */
int corral_netns_open(const char *path);

#endif
