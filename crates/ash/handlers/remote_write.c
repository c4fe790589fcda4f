/* Remote write (the paper's Figure 3) over UDP: the payload is a u32 window
 * offset, a u32 length and that many bytes of data, copied straight into the
 * window. A short, incomplete or out-of-window message aborts. */
#include "exonet_ash.h"

int ash_handle(int frame_len) {
    (void)frame_len;
    int32_t n = ash_skip_udp_headers();
    uint32_t dst, len;
    if (n < 8)
        ash_abort();
    if (consume(&dst, sizeof dst) < 0) /* destination (first word) */
        ash_abort();
    if (consume(&len, sizeof len) < 0) /* length (second word) */
        ash_abort();
    if (len > (uint32_t)n - 8) /* incomplete packet */
        ash_abort();
    uint32_t w = (uint32_t)window_len();
    if (len > w || dst > w - len)
        ash_abort();
    if (consume_window(dst, (int32_t)len, NULL_PIPE) < 0)
        ash_abort();
    return ASH_CONSUMED;
}
