/*
 * The probe cache for `corral confine --exec`'s C fast path (core/host/confine_fast.c):
 * whether lua/corral/probe_cache.lua's file holds for this process and keeps both
 * confinement layers (ns, landlock) as holding, as corral.confinement.layers would find
 * them without probing.
 */
#ifndef CORRAL_CONFINE_FAST_CACHE_H
#define CORRAL_CONFINE_FAST_CACHE_H

/* The file's path for the host executable `host` (`wrapper`: the wrapper program beside
 * it, part of the key), when its owner, mode and key are this process's and both layers
 * are kept; else NULL and *why. */
char *corral_fast_probe_cache(const char *host, const char *wrapper, const char **why);

#endif
