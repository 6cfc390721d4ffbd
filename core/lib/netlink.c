/* Netlink sockets opened in a target netns and one request's exchange (see netlink.h). */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/nsfs.h>

#include "netlink.h"
#include "ns.h"
#include "util.h"

/* One recv() worth: the kernel sizes dump skbs up to 32 KiB when the reader offers that
 * much (libmnl's MNL_SOCKET_DUMP_SIZE); a smaller buffer truncates them. */
#define NL_RECV_SIZE 32768

struct open_req {
    int bus;
    struct mnl_socket *nl;
};

/* Runs inside the target netns (corral_ns_run_in). */
static int open_netlink(void *arg)
{
    struct open_req *r = arg;
    r->nl = mnl_socket_open2(r->bus, SOCK_CLOEXEC);
    return r->nl ? 0 : -errno;
}

int corral_netlink_open_in(int netns_fd, int bus, struct mnl_socket **out)
{
    struct open_req req = {.bus = bus, .nl = NULL};
    int err = corral_ns_run_in(netns_fd, open_netlink, &req);
    if (err) return err;

    _cleanup_nl_ struct mnl_socket *nl = req.nl;
    if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) return -errno;
    int same = corral_ns_socket_is(mnl_socket_get_fd(nl), netns_fd);
    if (same < 0) return same;
    if (!same) return -EXDEV;
    *out = corral_steal_pointer(&nl);
    return 0;
}

int corral_netlink_talk(struct mnl_socket *nl, struct nlmsghdr *nlh, mnl_cb_t cb, void *data)
{
    static uint32_t seq_counter;
    uint32_t seq = __atomic_add_fetch(&seq_counter, 1, __ATOMIC_RELAXED);
    uint32_t portid = mnl_socket_get_portid(nl);
    _cleanup_free_ char *buf = malloc(NL_RECV_SIZE);
    if (!buf) return -ENOMEM;

    nlh->nlmsg_seq = seq;
    if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0) return -errno;
    for (;;) {
        ssize_t n = mnl_socket_recvfrom(nl, buf, NL_RECV_SIZE);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        int r = mnl_cb_run(buf, (size_t)n, seq, portid, cb, data);
        if (r < 0) return errno ? -errno : -EPROTO;
        if (r == MNL_CB_STOP) return 0;
    }
}

int corral_netns_open(const char *path)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int type = ioctl(fd, NS_GET_NSTYPE);
    if (type < 0) return errno == ENOTTY ? -EINVAL : -errno;
    if (type != CLONE_NEWNET) return -EINVAL;
    return corral_take_fd(&fd);
}
