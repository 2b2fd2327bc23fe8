"""Fixed-batch scheduling.

The typed work items (:mod:`.work`), the inbox and engine loop (:mod:`.batcher`),
the pure launch policy (:mod:`.policy`) and the thermal pacer (:mod:`.pacer`).
"""
