/*
 * core/lib/idmap.c against the real kernel: a root-owned directory, shown through an
 * idmapped tree, belongs to an unprivileged id H, which may then create a file there
 * that lands owned by root on the host (and may not, through the plain path); the tree
 * is nosuid and nodev, and read-only when asked; a filesystem without idmapped mounts
 * (ramfs) is refused with EINVAL; a hard link to a file outside the tree is found, one
 * inside it or of another owner is not; a setuid, setgid or file-capability program the
 * tenant could rewrite is found, one it could not is not. Nothing is left mounted, no fd is left
 * open.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <limits.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "check.h"
#include "fixture.h"
#include "fs.h"
#include "idmap.h"

#define H 1700000001u

static void touch(const char *rel, mode_t mode)
{
    int fd = open(at(rel), O_WRONLY | O_CREAT | O_CLOEXEC, mode);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
}

/* Lines of our mount table naming the test's directory (other processes on the host
 * mount and unmount their own meanwhile). */
static int mounts(void)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[4096];
    int n = 0;
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, fixture_root) != NULL;
    if (f) fclose(f);
    return n;
}

/* In a child that becomes H: create name in dirfd (the tree) or at path (the host's own
 * view). Returns 0 or the errno. */
static int create_as_h(int dirfd, const char *name)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (syscall(SYS_setresgid, H, H, H) < 0 || syscall(SYS_setresuid, H, H, H) < 0) _exit(99);
        int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        _exit(fd < 0 ? errno : 0);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

static void root_owned_directory_shown_as_h(void)
{
    CHECK(mkdir(at("op"), 0755) == 0);
    touch("op/f", 0644);
    int dir = open(at("op"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int userns = corral_idmap_userns(0, H, 0, H);
    CHECK(userns >= 0);
    int tree = corral_idmap_tree(dir, userns, 0);
    CHECK(tree >= 0);
    struct stat st;
    CHECK(fstatat(tree, "", &st, AT_EMPTY_PATH) == 0 && st.st_uid == H && st.st_gid == H);
    CHECK(fstatat(tree, "f", &st, 0) == 0 && st.st_uid == H);
    /* Attempt: H creates through the host's own path (root's 0755 directory): refused. */
    CHECK(create_as_h(dir, "plain") == EACCES);
    /* Control: through the idmapped tree it may, and the file is root's on the host. */
    CHECK(create_as_h(tree, "made") == 0);
    CHECK(stat(at("op/made"), &st) == 0 && st.st_uid == 0 && st.st_gid == 0);
    struct statvfs v;
    CHECK(fstatvfs(tree, &v) == 0 && (v.f_flag & ST_NOSUID) && (v.f_flag & ST_NODEV));
    close(tree);
    /* Read-only when asked. */
    int ro = corral_idmap_tree(dir, userns, CORRAL_TREE_RDONLY);
    CHECK(ro >= 0);
    CHECK(openat(ro, "f", O_WRONLY | O_CLOEXEC) < 0 && errno == EROFS);
    int rd = openat(ro, "f", O_RDONLY | O_CLOEXEC); /* control */
    CHECK(rd >= 0);
    if (rd >= 0) close(rd);
    /* An idmap over the mounts beneath is not offered. */
    CHECK(corral_idmap_tree(dir, userns, CORRAL_TREE_RECURSIVE) == -EINVAL);
    close(ro);
    close(userns);
    close(dir);
}

/* ramfs has no idmapped mounts: EINVAL, in a namespace of the child's own (nothing on the
 * host's mount table); tmpfs, the control, has them. */
static void unsupported_filesystem(void)
{
    CHECK(mkdir(at("rf"), 0755) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
            _exit(90);
        int userns = corral_idmap_userns(0, H, 0, H);
        if (userns < 0) _exit(91);
        const char *kinds[] = {"ramfs", "tmpfs"};
        int got[2];
        for (int i = 0; i < 2; i++) {
            if (mount(kinds[i], at("rf"), kinds[i], 0, NULL) < 0) _exit(92);
            int dir = open(at("rf"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            got[i] = corral_idmap_tree(dir, userns, 0);
            if (got[i] >= 0) close(got[i]);
            close(dir);
            umount2(at("rf"), MNT_DETACH);
        }
        _exit(got[0] == -EINVAL && got[1] >= 0 ? 0 : 1);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
}

static void hard_links_out_of_the_tree(void)
{
    struct corral_idmap_findings f;
    CHECK(mkdir(at("links"), 0755) == 0);
    CHECK(mkdir(at("links/sub"), 0755) == 0);
    CHECK(mkdir(at("outside"), 0755) == 0);
    touch("links/a", 0644);
    touch("outside/victim", 0644);
    touch("outside/theirs", 0644);
    CHECK(chown(at("outside/theirs"), 4242, 4242) == 0);
    /* Control: links that stay inside, and another owner's link out, are no finding. */
    CHECK(link(at("links/a"), at("links/sub/a2")) == 0);
    CHECK(link(at("outside/theirs"), at("links/theirs")) == 0);
    int dir = open(at("links"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int tree = corral_idmap_tree(dir, -1, CORRAL_TREE_RDONLY); /* what a tenant would see */
    CHECK(tree >= 0);
    CHECK(corral_idmap_scan(tree, 0, 0, NULL, &f) == 0 && f.links == 0 && f.link[0] == '\0');
    /* Attempt: a link to a root-owned file outside, deep in the tree. */
    CHECK(link(at("outside/victim"), at("links/sub/planted")) == 0);
    CHECK(corral_idmap_scan(tree, 0, 0, NULL, &f) == 0 && f.links == 1);
    CHECK(strcmp(f.link, "sub/planted") == 0);
    /* The same file's owner asked for as 4242 (theirs): one finding, not root's. */
    CHECK(corral_idmap_scan(tree, 4242, 4242, NULL, &f) == 0 && f.links == 1);
    CHECK(strcmp(f.link, "theirs") == 0);
    CHECK(f.privileged == 0);
    close(tree);
    close(dir);
}

/* Programs that run with privileges on the host are found where the tenant could rewrite
 * them (the owner's, or writable by the group or anyone), and only there. */
static void privileged_programs(void)
{
    struct corral_idmap_findings f;
    CHECK(mkdir(at("priv"), 0755) == 0);
    CHECK(mkdir(at("priv/bin"), 0755) == 0);
    /* Controls first: plain programs, a setgid file without group execute (mandatory
     * locking, no privilege), and another owner's setuid program the tenant cannot write. */
    touch("priv/bin/plain", 0755);
    touch("priv/locking", 0644);
    CHECK(chmod(at("priv/locking"), 02644) == 0);
    touch("priv/theirs", 0755);
    CHECK(chown(at("priv/theirs"), 4242, 4242) == 0 && chmod(at("priv/theirs"), 04755) == 0);
    int dir = open(at("priv"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int tree = corral_idmap_tree(dir, -1, CORRAL_TREE_RDONLY);
    CHECK(tree >= 0);
    CHECK(corral_idmap_scan(tree, 0, 0, NULL, &f) == 0 && f.privileged == 0 &&
          f.privileged_path[0] == '\0');
    /* Attempts: root's setuid program, a setgid one, another owner's that anyone may write,
     * and one with a file capability (v2, cap_setuid), each found. */
    touch("priv/bin/su", 0755);
    CHECK(chmod(at("priv/bin/su"), 04755) == 0);
    CHECK(corral_idmap_scan(tree, 0, 0, NULL, &f) == 0 && f.privileged == 1);
    CHECK(strcmp(f.privileged_path, "bin/su") == 0);
    CHECK(chmod(at("priv/bin/su"), 02755) == 0);
    CHECK(corral_idmap_scan(tree, 0, 0, NULL, &f) == 0 && f.privileged == 1);
    CHECK(chmod(at("priv/bin/su"), 0755) == 0 && chmod(at("priv/theirs"), 04757) == 0);
    CHECK(corral_idmap_scan(tree, 0, 0, NULL, &f) == 0 && f.privileged == 1);
    CHECK(strcmp(f.privileged_path, "theirs") == 0);
    CHECK(chmod(at("priv/theirs"), 0755) == 0);
    unsigned char cap[20] = {0x01, 0x00, 0x00, 0x02,
                             0x80}; /* VFS_CAP_REVISION_2 | effective; CAP_SETUID */
    CHECK(setxattr(at("priv/bin/plain"), "security.capability", cap, sizeof cap, 0) == 0);
    CHECK(corral_idmap_scan(tree, 0, 0, NULL, &f) == 0 && f.privileged == 1);
    CHECK(strcmp(f.privileged_path, "bin/plain") == 0);
    /* The same where the kernel has no getxattrat (before 6.13): in a child whose filter
     * answers it ENOSYS, found through /proc/self/fd. */
    pid_t pid = fork();
    if (pid == 0) {
        struct sock_filter insns[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 464, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = {sizeof insns / sizeof insns[0], insns};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
            syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
            _exit(90);
        long r = syscall(464, AT_FDCWD, "/", 0, "user.x", NULL, 0);
        if (r >= 0 || errno != ENOSYS) _exit(91);
        struct corral_idmap_findings g;
        _exit(corral_idmap_scan(tree, 0, 0, NULL, &g) == 0 && g.privileged == 1 &&
                      strcmp(g.privileged_path, "bin/plain") == 0
                  ? 0
                  : 1);
    }
    int ws = 0;
    waitpid(pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    /* Control: the same tree asked for as another owner holds nothing of its to rewrite. */
    CHECK(corral_idmap_scan(tree, 5555, 5555, NULL, &f) == 0 && f.privileged == 0);
    close(tree);
    close(dir);
}

/* A directory carrying the mark beneath the top is another sandbox's storage: found, and
 * not walked; the top's own mark, and a tree without one, are no finding. */
static void marked_storages_inside(void)
{
    static const char mark[] = "trusted.corral-test.storage";
    struct corral_idmap_findings f;
    CHECK(mkdir(at("outer"), 0755) == 0);
    CHECK(mkdir(at("outer/data"), 0755) == 0);
    CHECK(mkdir(at("outer/b"), 0700) == 0);
    touch("outer/b/su", 04755); /* inside the other storage: not walked */
    CHECK(chmod(at("outer/b/su"), 04755) == 0);
    int top = open(at("outer"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int inner = open(at("outer/b"), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK(corral_dir_marked(at("outer/b"), mark) == 0);
    CHECK(corral_mark_dir(top, mark) == 0);
    int tree = corral_idmap_tree(top, -1, CORRAL_TREE_RDONLY);
    CHECK(tree >= 0);
    /* Control: only the top carries it. */
    CHECK(corral_idmap_scan(tree, 0, 0, mark, &f) == 0 && f.storages == 0 && f.privileged == 1);
    CHECK(corral_mark_dir(inner, mark) == 0 && corral_dir_marked(at("outer/b"), mark) == 1);
    CHECK(corral_idmap_scan(tree, 0, 0, mark, &f) == 0 && f.storages == 1 && f.privileged == 0);
    CHECK(strcmp(f.storage, "b") == 0);
    CHECK(corral_idmap_scan(tree, 0, 0, NULL, &f) == 0 && f.storages == 0);
    close(tree);
    close(inner);
    close(top);
}

int main(void)
{
    if (geteuid() != 0) {
        printf("%s: skipped (idmapped mounts need root)\n", __FILE__);
        return 0;
    }
    if (fixture_make("idmap") < 0) return 1;
    CHECK(chmod(fixture_root, 0755) == 0);
    int fds = count_fds(), mounted = mounts();
    root_owned_directory_shown_as_h();
    unsupported_filesystem();
    hard_links_out_of_the_tree();
    privileged_programs();
    marked_storages_inside();
    CHECK(count_fds() == fds);
    CHECK(mounts() == mounted && mounted == 0);
    CHECK(corral_remove_tree(fixture_root) == 0);
    return DONE();
}
