/* placeholder host: replaced by the real lua.c-style host */
#include <stdio.h>
#include <string.h>
#include "confine.h"
int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "exec-confined") == 0)
        return corral_exec_confined_main(argc - 1, argv + 1);
    return 0;
}
