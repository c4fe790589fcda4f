/* UDP echo: replies with the same payload and consumes the request. */
#include "exonet_ash.h"

static uint8_t payload[65472];

int ash_handle(int frame_len) {
    (void)frame_len;
    int32_t n = ash_skip_udp_headers();
    if (n < 0 || n > (int32_t)sizeof payload)
        ash_abort();
    consume(payload, n);
    if (reply_udp(payload, n) < 0)
        ash_abort();
    return ASH_CONSUMED;
}
