#include "confine.h"
int corral_exec_confined_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return CORRAL_EXIT_SETUP;
}
