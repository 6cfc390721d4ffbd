/* rtnetlink link/address/route verbs in a target netns (see rtnl.h). */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <net/if.h>
#include <netinet/in.h>
#include <linux/if_addr.h>
#include <linux/if_link.h>
#include <linux/fib_rules.h>
#include <linux/nsfs.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>

#include "netlink.h"
#include "rtnl.h"
#include "util.h"

/* One recv() worth: the kernel sizes dump skbs up to 32 KiB when the reader offers that
 * much (libmnl's MNL_SOCKET_DUMP_SIZE); a smaller buffer truncates them. */
#define NL_RECV_SIZE 32768
#define NL_REQ_SIZE 1024

static int check_ifname(const char *ifname)
{
    size_t len = ifname ? strlen(ifname) : 0;
    return len == 0 || len >= IFNAMSIZ ? -EINVAL : 0;
}

static struct nlmsghdr *put_request(char *buf, uint16_t type, uint16_t flags)
{
    memset(buf, 0, NL_REQ_SIZE);
    struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
    nlh->nlmsg_type = type;
    nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    return nlh;
}

static int link_index_cb(const struct nlmsghdr *nlh, void *data)
{
    if (nlh->nlmsg_type != RTM_NEWLINK || nlh->nlmsg_len < mnl_nlmsg_size(sizeof(struct ifinfomsg)))
        return MNL_CB_OK;
    const struct ifinfomsg *ifi = mnl_nlmsg_get_payload(nlh);
    *(int *)data = ifi->ifi_index;
    return MNL_CB_OK;
}

static int link_index(struct mnl_socket *nl, const char *ifname)
{
    char buf[NL_REQ_SIZE];
    int err = check_ifname(ifname);
    if (err) return err;
    struct nlmsghdr *nlh = put_request(buf, RTM_GETLINK, 0);
    struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(nlh, sizeof *ifi);
    ifi->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(nlh, IFLA_IFNAME, ifname);
    mnl_attr_put_u32(nlh, IFLA_EXT_MASK, RTEXT_FILTER_SKIP_STATS);
    int index = 0;
    err = corral_netlink_talk(nl, nlh, link_index_cb, &index);
    if (err) return err;
    return index > 0 ? index : -ENODEV;
}

static int rtnl_open(int netns_fd, struct mnl_socket **nl)
{
    return corral_netlink_open_in(netns_fd, NETLINK_ROUTE, nl);
}

int corral_rtnl_link_index(int netns_fd, const char *ifname)
{
    _cleanup_nl_ struct mnl_socket *nl = NULL;
    int err = check_ifname(ifname);
    if (err) return err;
    err = rtnl_open(netns_fd, &nl);
    if (err) return err;
    return link_index(nl, ifname);
}

/* Looks the link up by IFLA_IFNAME in the kernel itself: one round trip, no race between a
 * lookup and the change. */
static int link_change(struct mnl_socket *nl, uint16_t type, const char *ifname, unsigned up)
{
    char buf[NL_REQ_SIZE];
    struct nlmsghdr *nlh = put_request(buf, type, 0);
    struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(nlh, sizeof *ifi);
    ifi->ifi_family = AF_UNSPEC;
    ifi->ifi_flags = up;
    ifi->ifi_change = up;
    mnl_attr_put_strz(nlh, IFLA_IFNAME, ifname);
    return corral_netlink_talk(nl, nlh, NULL, NULL);
}

static int link_change_in(int netns_fd, uint16_t type, const char *ifname, unsigned up)
{
    _cleanup_nl_ struct mnl_socket *nl = NULL;
    int err = check_ifname(ifname);
    if (err) return err;
    err = rtnl_open(netns_fd, &nl);
    if (err) return err;
    return link_change(nl, type, ifname, up);
}

int corral_rtnl_link_up(int netns_fd, const char *ifname)
{
    return link_change_in(netns_fd, RTM_NEWLINK, ifname, IFF_UP);
}

int corral_rtnl_link_del(int netns_fd, const char *ifname)
{
    return link_change_in(netns_fd, RTM_DELLINK, ifname, 0);
}

/* A new default route (dst_len 0) that corral installs (RTPROT_STATIC), its attributes
 * still to add. */
static struct nlmsghdr *put_default_route(char *buf, int family, unsigned char table,
                                          unsigned char type, unsigned char scope)
{
    struct nlmsghdr *nlh = put_request(buf, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL);
    struct rtmsg *rtm = mnl_nlmsg_put_extra_header(nlh, sizeof *rtm);
    rtm->rtm_family = (unsigned char)family;
    rtm->rtm_dst_len = 0;
    rtm->rtm_table = table;
    rtm->rtm_protocol = RTPROT_STATIC;
    rtm->rtm_type = type;
    rtm->rtm_scope = scope;
    return nlh;
}

static int default_route(struct mnl_socket *nl, int family, int oif)
{
    char buf[NL_REQ_SIZE];
    struct nlmsghdr *nlh = put_default_route(buf, family, RT_TABLE_MAIN, RTN_UNICAST,
                                             family == AF_INET ? RT_SCOPE_LINK : RT_SCOPE_UNIVERSE);
    mnl_attr_put_u32(nlh, RTA_OIF, (uint32_t)oif);
    if (family == AF_INET) {
        /* Without a preferred source the scope-link route through lo picks no address
         * (127.0.0.1 is host scope): the SYN leaves from 0.0.0.0 and replies to the
         * redirected connection never reach the client (tests/c/test_nft.c end to end). */
        struct in_addr src = {.s_addr = htonl(INADDR_LOOPBACK)};
        mnl_attr_put(nlh, RTA_PREFSRC, sizeof src, &src);
    }
    return corral_netlink_talk(nl, nlh, NULL, NULL);
}

int corral_rtnl_lo_default_routes(int netns_fd)
{
    _cleanup_nl_ struct mnl_socket *nl = NULL;
    int err = rtnl_open(netns_fd, &nl);
    if (err) return err;
    int lo = link_index(nl, "lo");
    if (lo < 0) return lo;
    err = link_change(nl, RTM_NEWLINK, "lo", IFF_UP);
    if (err) return err;
    err = default_route(nl, AF_INET, lo);
    if (err) return err;
    return default_route(nl, AF_INET6, lo);
}

int corral_rtnl_veth(int host_netns_fd, const char *host_name, int peer_netns_fd,
                     const char *peer_name)
{
    _cleanup_nl_ struct mnl_socket *nl = NULL;
    char buf[NL_REQ_SIZE];
    int err = check_ifname(host_name);
    if (!err) err = check_ifname(peer_name);
    if (err) return err;
    if (peer_netns_fd < 0) return -EBADF;
    err = rtnl_open(host_netns_fd, &nl);
    if (err) return err;

    struct nlmsghdr *nlh = put_request(buf, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
    struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(nlh, sizeof *ifi);
    ifi->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(nlh, IFLA_IFNAME, host_name);
    struct nlattr *linkinfo = mnl_attr_nest_start(nlh, IFLA_LINKINFO);
    mnl_attr_put_strz(nlh, IFLA_INFO_KIND, "veth");
    struct nlattr *info = mnl_attr_nest_start(nlh, IFLA_INFO_DATA);
    struct nlattr *peer = mnl_attr_nest_start(nlh, VETH_INFO_PEER);
    /* The peer's attributes follow an ifinfomsg of their own (drivers/net/veth.c). */
    struct ifinfomsg *peer_ifi = mnl_nlmsg_put_extra_header(nlh, sizeof *peer_ifi);
    peer_ifi->ifi_family = AF_UNSPEC;
    mnl_attr_put_strz(nlh, IFLA_IFNAME, peer_name);
    mnl_attr_put_u32(nlh, IFLA_NET_NS_FD, (uint32_t)peer_netns_fd);
    mnl_attr_nest_end(nlh, peer);
    mnl_attr_nest_end(nlh, info);
    mnl_attr_nest_end(nlh, linkinfo);
    return corral_netlink_talk(nl, nlh, NULL, NULL);
}

int corral_rtnl_addr(int netns_fd, const char *ifname, int family, const void *addr, int prefixlen)
{
    _cleanup_nl_ struct mnl_socket *nl = NULL;
    char buf[NL_REQ_SIZE];
    size_t alen;
    int err = check_ifname(ifname);
    if (err) return err;
    if (family == AF_INET)
        alen = 4;
    else if (family == AF_INET6)
        alen = 16;
    else
        return -EAFNOSUPPORT;
    if (!addr || prefixlen < 0 || prefixlen > (int)alen * 8) return -EINVAL;
    err = rtnl_open(netns_fd, &nl);
    if (err) return err;
    int index = link_index(nl, ifname);
    if (index < 0) return index;

    struct nlmsghdr *nlh = put_request(buf, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL);
    struct ifaddrmsg *ifa = mnl_nlmsg_put_extra_header(nlh, sizeof *ifa);
    ifa->ifa_family = (unsigned char)family;
    ifa->ifa_prefixlen = (unsigned char)prefixlen;
    ifa->ifa_scope = RT_SCOPE_UNIVERSE;
    ifa->ifa_index = (unsigned)index;
    mnl_attr_put(nlh, IFA_LOCAL, alen, addr);
    mnl_attr_put(nlh, IFA_ADDRESS, alen, addr);
    if (family == AF_INET6) {
        /* A sandbox's link has exactly two ends, both ours: DAD would only keep the address
         * tentative (unusable as a source) for a second or more after the link comes up. */
        ifa->ifa_flags = IFA_F_NODAD;
        mnl_attr_put_u32(nlh, IFA_FLAGS, IFA_F_NODAD);
    }
    return corral_netlink_talk(nl, nlh, NULL, NULL);
}

int corral_rtnl_default_via(int netns_fd, int family, const void *gateway, const char *ifname)
{
    _cleanup_nl_ struct mnl_socket *nl = NULL;
    char buf[NL_REQ_SIZE];
    int err = check_ifname(ifname);
    if (err) return err;
    if (family != AF_INET && family != AF_INET6) return -EAFNOSUPPORT;
    err = rtnl_open(netns_fd, &nl);
    if (err) return err;
    int oif = link_index(nl, ifname);
    if (oif < 0) return oif;
    struct nlmsghdr *nlh =
        put_default_route(buf, family, RT_TABLE_MAIN, RTN_UNICAST, RT_SCOPE_UNIVERSE);
    mnl_attr_put(nlh, RTA_GATEWAY, family == AF_INET ? 4 : 16, gateway);
    mnl_attr_put_u32(nlh, RTA_OIF, (uint32_t)oif);
    return corral_netlink_talk(nl, nlh, NULL, NULL);
}

/* `ip [-6] rule add fwmark MARK lookup TABLE pref PRIO` */
static int mark_rule(struct mnl_socket *nl, int family, uint32_t mark, uint32_t table)
{
    char buf[NL_REQ_SIZE];
    struct nlmsghdr *nlh = put_request(buf, RTM_NEWRULE, NLM_F_CREATE | NLM_F_EXCL);
    struct fib_rule_hdr *frh = mnl_nlmsg_put_extra_header(nlh, sizeof *frh);
    frh->family = (unsigned char)family;
    frh->action = FR_ACT_TO_TBL;
    frh->table = RT_TABLE_UNSPEC;
    mnl_attr_put_u32(nlh, FRA_FWMARK, mark);
    mnl_attr_put_u32(nlh, FRA_FWMASK, 0xffffffffu);
    mnl_attr_put_u32(nlh, FRA_TABLE, table);
    mnl_attr_put_u32(nlh, FRA_PRIORITY, CORRAL_RTNL_MARK_RULE_PRIO);
    return corral_netlink_talk(nl, nlh, NULL, NULL);
}

/* `ip [-6] route add local default dev lo table TABLE` */
static int local_default(struct mnl_socket *nl, int family, uint32_t table, int lo)
{
    char buf[NL_REQ_SIZE];
    struct nlmsghdr *nlh =
        put_default_route(buf, family, RT_TABLE_UNSPEC, RTN_LOCAL, RT_SCOPE_HOST);
    mnl_attr_put_u32(nlh, RTA_TABLE, table);
    mnl_attr_put_u32(nlh, RTA_OIF, (uint32_t)lo);
    return corral_netlink_talk(nl, nlh, NULL, NULL);
}

int corral_rtnl_mark_local(int netns_fd, uint32_t mark, uint32_t table)
{
    _cleanup_nl_ struct mnl_socket *nl = NULL;
    if (!mark || table == RT_TABLE_UNSPEC || table >= RT_TABLE_COMPAT) return -EINVAL;
    int err = rtnl_open(netns_fd, &nl);
    if (err) return err;
    int lo = link_index(nl, "lo");
    if (lo < 0) return lo;
    static const int families[] = {AF_INET, AF_INET6};
    for (size_t i = 0; i < 2; i++) {
        err = local_default(nl, families[i], table, lo);
        if (!err) err = mark_rule(nl, families[i], mark, table);
        if (err) return err;
    }
    return 0;
}
