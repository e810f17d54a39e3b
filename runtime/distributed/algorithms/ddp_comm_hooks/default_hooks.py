"""torch's default DDP comm hooks: hook(process_group, bucket) -> Future of the bucket's averaged gradients."""
from __future__ import annotations

from .... import distributed as dist
from .... import float16


def _group_size(process_group) -> int:
    return dist.get_world_size(process_group)


def _allreduce_fut(process_group, tensor):
    """Average `tensor` over the group in place (divide, then all-reduce); a Future of it."""
    tensor.div_(_group_size(process_group))
    return dist.all_reduce(tensor, group=process_group, async_op=True).get_future().then(lambda fut: fut.value()[0])


def allreduce_hook(process_group, bucket):
    """What DDP does without a hook: the bucket's gradients averaged over the group."""
    return _allreduce_fut(process_group, bucket.buffer())


def fp16_compress_hook(process_group, bucket):
    """Average in float16 (half the bytes on the wire), then cast back into the bucket: gradients lose precision."""
    buffer = bucket.buffer()
    compressed = buffer.to(float16).div_(_group_size(process_group))

    def decompress(fut):
        buffer.copy_(fut.value()[0])
        return buffer
    return dist.all_reduce(compressed, group=process_group, async_op=True).get_future().then(decompress)
