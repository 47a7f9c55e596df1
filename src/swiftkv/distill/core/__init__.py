"""The training core: the loop, a step's pieces, the loss, what trains, checkpoints, micro-batches and compiled layers."""
