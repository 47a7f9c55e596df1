"""Data for every stage: `--data` readers (`chat`), ShareGPT and its held-out boundary (`sharegpt`,
`heldout`), token documents with their target mask (`tokens`) and packed training blocks (`packing`)."""
