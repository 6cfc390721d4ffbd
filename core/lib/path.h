/*
 * Path resolution: one implementation for every grant and every invocation (resolve
 * before grant, docs/architecture.md invariant 3). Binding a symlink's target while
 * invoking the symlink fails outright, and SBPL matches resolved paths, so a grant
 * written against a symlink silently never matches: the grant and the invocation use the
 * same resolved string.
 */
#ifndef CORRAL_PATH_H
#define CORRAL_PATH_H

/* Physically resolves an existing path component by component as the kernel does:
 * relative link targets against the link's directory, `..` applied after a symlink to
 * its target, ELOOP after 40 links. Relative paths are taken against the working
 * directory. Returns 0 and a malloc'd absolute path in *out, or -errno. */
int corral_resolve_file(const char *path, char **out);

/* corral_resolve_file, and the result must be a directory (-ENOTDIR otherwise). */
int corral_resolve_dir(const char *path, char **out);

/* A bare name through path_env (PATH; NULL means the default search path), then the
 * symlink chain. A name not found on PATH, or a path that does not exist, is returned
 * unchanged (as a malloc'd copy) so the exec earns the OS's own error. Returns 0 or
 * -errno (ELOOP for a loop, ENOMEM). */
int corral_resolve_executable(const char *cmd, const char *path_env, char **out);

#endif
