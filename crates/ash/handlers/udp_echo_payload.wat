;; UDP echo for a handler installed with UDP below it (HandlerSpec::below =
;; Udp): its message is the payload, already past the checked headers, and
;; the multiplexer drops the reply with the datagram if the checksum fails.
(module
  (import "exonet" "consume" (func $consume (param i32 i32) (result i32)))
  (import "exonet" "reply_udp" (func $reply_udp (param i32 i32) (result i32)))
  (memory (export "memory") 1)

  (func (export "ash_handle") (param $len i32) (result i32)
    ;; Longer than memory, or no room for the reply: the application answers.
    (if (i32.lt_s (call $consume (i32.const 0) (local.get $len)) (i32.const 0))
      (then (return (i32.const 1))))
    (if (i32.lt_s (call $reply_udp (i32.const 0) (local.get $len)) (i32.const 0))
      (then (return (i32.const 1))))
    (i32.const 0)))
