"""Where our pipes meet PyTorch's loaders: ``hooks`` (``state_dict``, ``load_state_dict`` and
``set_epoch`` on every pipeline of ours) and ``dataloader2`` (DataLoader2's reading service with a
worker loop that survives uneven workers)."""
