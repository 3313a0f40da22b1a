"""deepspeed.runtime.dataloader: RepeatingLoader (initialize(training_data=...) returns a torch
DataLoader, zerod.torch's engine.deepspeed_io)."""


class RepeatingLoader:
    """Iterates over loader forever, starting it again when it ends."""

    def __init__(self, loader):
        self.loader = loader
        self.data_iter = iter(self.loader)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.data_iter)
        except StopIteration:
            self.data_iter = iter(self.loader)
            return next(self.data_iter)
