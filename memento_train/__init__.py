"""memento-train: teach LLMs to reason in blocks, close each with a memento, and evict the block's KV."""

__version__ = "0.1.0"
