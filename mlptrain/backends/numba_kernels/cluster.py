"""Thread-block clusters (CUDA backend, sm_90+): a grid's blocks in groups that the GPU runs at once, each block
reading the others' shared memory (distributed shared memory).

A split pass's chunks of one output tile are such a group (gemm_split.make_cluster_rows): each block keeps its
partial tile in its own shared memory, and the cluster adds the tiles there instead of through a workspace and a
launch of their own:

    cluster_sync()                 returns once every thread of every block of the cluster has called it; the
                                   shared-memory writes each made before it are then visible to the whole cluster
                                   (barrier.cluster, release then acquire)
    cluster_done()                 returns once every thread of every block of the cluster has called it, with no
                                   memory ordering (barrier.cluster, relaxed arrive): where a block's reads of the
                                   others' shared memory are finished (their values used) and it only has to keep
                                   its own until they are, it does not wait for its global writes to drain
    cluster_load(address, rank)    the float32 at `address` (a block's shared-memory byte address, as
                                   async_copy.shared_address gives it) in the shared memory of the cluster's block
                                   `rank` (%cluster_ctarank: along a cluster spanning the grid's z axis, blockIdx.z)

A cluster is a launch attribute (`kernel_cache.jit(cluster_z=True)`: the grid's z axis one cluster), which only
the driver path sets (`kernel_cache.cluster_launches`). The simulator runs a grid's blocks one after another, so a
cluster's barrier could never be met there: these raise on it, and the passes that use them never run on it.
"""

import functools

from mlptrain.backends.kernel_cache.numba_names import DEFERRED, Deferred, config, cuda


def _simulated():
    @cuda.jit(device=True)
    def cluster_sync():
        raise NotImplementedError("the CUDA simulator has no thread-block clusters")

    @cuda.jit(device=True)
    def cluster_done():
        raise NotImplementedError("the CUDA simulator has no thread-block clusters")

    @cuda.jit(device=True)
    def cluster_load(address, rank):
        raise NotImplementedError("the CUDA simulator has no thread-block clusters")

    return cluster_sync, cluster_load, cluster_done


def _inline():
    # imported on first use: numba takes seconds to import, and the CPU path never needs it
    from llvmlite import ir
    from numba import types
    from numba.cuda.extending import intrinsic

    i32 = ir.IntType(32)

    def barrier(text):
        """An intrinsic () -> None running the PTX `text` (a cluster barrier), which nothing moves across."""
        @intrinsic
        def cluster_barrier(typingctx):
            def codegen(context, builder, sig, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True)
                builder.call(asm, [])
                return context.get_dummy_value()

            return types.void(), codegen

        return cluster_barrier

    cluster_sync = barrier("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;")
    cluster_done = barrier("barrier.cluster.arrive.relaxed.aligned;\n\tbarrier.cluster.wait.aligned;")

    @intrinsic
    def cluster_load(typingctx, address, rank):
        signature = types.float32(address, rank)

        def codegen(context, builder, sig, args):
            here = context.cast(builder, args[0], sig.args[0], types.uint32)
            block = context.cast(builder, args[1], sig.args[1], types.uint32)
            # side_effect: the load must stay between the barriers that order it, not move across them
            asm = ir.InlineAsm(ir.FunctionType(ir.FloatType(), [i32, i32]),
                               "{ .reg .u32 r; mapa.shared::cluster.u32 r, $1, $2; ld.shared::cluster.f32 $0, [r]; }",
                               "=f,r,r,~{memory}", side_effect=True)
            return builder.call(asm, [here, block])

        return signature, codegen

    return cluster_sync, cluster_load, cluster_done


@functools.cache
def _parts():
    return _simulated() if config.ENABLE_CUDASIM else _inline()


def _part(which):
    return _parts()[which]


cluster_sync = Deferred(_part, (0,)) if DEFERRED else _part(0)
cluster_load = Deferred(_part, (1,)) if DEFERRED else _part(1)
cluster_done = Deferred(_part, (2,)) if DEFERRED else _part(2)
