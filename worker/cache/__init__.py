"""KV cache: the pure-python block allocator and the device cache tensors.

NOTE: keep this file free of imports; the scheduler imports
`intentserve.worker.cache.block_allocator`, which must load without torch.
"""
