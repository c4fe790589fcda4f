;; Remote write (the paper's Figure 3) over UDP. The payload is a u32 window
;; offset, a u32 length (both little-endian) and that many bytes of data,
;; which are copied straight into the window (message vectoring). A short,
;; incomplete or out-of-window message aborts: the application sees it.
(module
  (import "exonet" "msg_len" (func $msg_len (result i32)))
  (import "exonet" "peek" (func $peek (param i32 i32 i32) (result i32)))
  (import "exonet" "seek" (func $seek (param i32) (result i32)))
  (import "exonet" "abort" (func $abort))
  (import "exonet" "consume" (func $consume (param i32 i32) (result i32)))
  (import "exonet" "consume_window" (func $consume_window (param i32 i32 i32) (result i32)))
  (import "exonet" "window_len" (func $window_len (result i32)))
  (memory (export "memory") 1)

  (func (export "ash_handle") (param $frame_len i32) (result i32)
    (local $n i32) (local $dst i32) (local $len i32)
    (local.set $n (call $udp_payload))
    (if (i32.lt_s (local.get $n) (i32.const 8))
      (then (call $abort)))
    ;; destination (first word), length (second word)
    (if (i32.lt_s (call $consume (i32.const 32) (i32.const 4)) (i32.const 0))
      (then (call $abort)))
    (if (i32.lt_s (call $consume (i32.const 36) (i32.const 4)) (i32.const 0))
      (then (call $abort)))
    (local.set $dst (i32.load (i32.const 32)))
    (local.set $len (i32.load (i32.const 36)))
    ;; incomplete packet
    (if (i32.gt_u (local.get $len) (i32.sub (local.get $n) (i32.const 8)))
      (then (call $abort)))
    ;; outside the window
    (if (i32.gt_u (local.get $len) (call $window_len))
      (then (call $abort)))
    (if (i32.gt_u (local.get $dst) (i32.sub (call $window_len) (local.get $len)))
      (then (call $abort)))
    (if (i32.lt_s (call $consume_window (local.get $dst) (local.get $len) (i32.const -1))
                  (i32.const 0))
      (then (call $abort)))
    (i32.const 0))

  ;; ash_skip_udp_headers() of exonet_ash.h: checks the frame is untagged
  ;; Ethernet/IPv4/UDP (unfragmented, lengths consistent), moves the cursor
  ;; to the UDP payload and returns its length, or -1. Uses memory [0, 32).
  (func $udp_payload (result i32)
    (local $ihl i32) (local $ip_len i32) (local $udp_len i32)
    (if (i32.lt_s (call $peek (i32.const 0) (i32.const 0) (i32.const 24)) (i32.const 0))
      (then (return (i32.const -1))))
    (if (i32.ne (call $be16 (i32.const 12)) (i32.const 0x0800))
      (then (return (i32.const -1))))
    (if (i32.ne (i32.shr_u (i32.load8_u (i32.const 14)) (i32.const 4)) (i32.const 4))
      (then (return (i32.const -1))))
    (if (i32.ne (i32.load8_u (i32.const 23)) (i32.const 17))
      (then (return (i32.const -1))))
    (local.set $ihl (i32.shl (i32.and (i32.load8_u (i32.const 14)) (i32.const 0x0f)) (i32.const 2)))
    ;; options too short, or a fragment
    (if (i32.lt_s (local.get $ihl) (i32.const 20))
      (then (return (i32.const -1))))
    (if (i32.and (call $be16 (i32.const 20)) (i32.const 0x3fff))
      (then (return (i32.const -1))))
    (local.set $ip_len (call $be16 (i32.const 16)))
    (if (i32.lt_s (local.get $ip_len) (i32.add (local.get $ihl) (i32.const 8)))
      (then (return (i32.const -1))))
    (if (i32.gt_s (i32.add (i32.const 14) (local.get $ip_len)) (call $msg_len))
      (then (return (i32.const -1))))
    (if (i32.lt_s (call $peek (i32.const 24) (i32.add (i32.const 14) (local.get $ihl)) (i32.const 8))
                  (i32.const 0))
      (then (return (i32.const -1))))
    (local.set $udp_len (call $be16 (i32.const 28)))
    (if (i32.lt_s (local.get $udp_len) (i32.const 8))
      (then (return (i32.const -1))))
    (if (i32.gt_s (local.get $udp_len) (i32.sub (local.get $ip_len) (local.get $ihl)))
      (then (return (i32.const -1))))
    (drop (call $seek (i32.add (local.get $ihl) (i32.const 22))))
    (i32.sub (local.get $udp_len) (i32.const 8)))

  ;; The big-endian 16-bit word at $p.
  (func $be16 (param $p i32) (result i32)
    (i32.or (i32.shl (i32.load8_u (local.get $p)) (i32.const 8))
            (i32.load8_u offset=1 (local.get $p)))))
