"""matmul-drift: speed, accuracy and kernel drift of torch.matmul, tracked with asv."""

__version__ = "0.1.0"
