/* The empty handler: delivers every frame at once. */
#include "exonet_ash.h"

int ash_handle(int frame_len) {
    (void)frame_len;
    return ASH_DELIVER;
}
