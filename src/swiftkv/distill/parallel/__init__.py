"""The process group, FSDP2 sharding and the blocks one process tokenizes for all."""
