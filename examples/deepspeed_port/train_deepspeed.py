import os, sys
import torch
import deepspeed

out_dir = sys.argv[1] if len(sys.argv) > 1 else "ds_port_out"
dtype = torch.float32 if os.environ.get("ZEROD_PORT_DTYPE") == "fp32" else torch.bfloat16
ds_config = {
    "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0, "bf16": {"enabled": dtype == torch.bfloat16},
    "zero_optimization": {"stage": 2, "reduce_bucket_size": 20000},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}},
    "scheduler": {"type": "WarmupDecayLR", "params": {
        "warmup_max_lr": 3e-3, "warmup_num_steps": 5, "total_num_steps": 20}}}
deepspeed.init_distributed()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                            torch.nn.GELU(), torch.nn.Linear(256, 16))
engine, optimizer, _, lr_scheduler = deepspeed.initialize(
    model=model, model_parameters=model.parameters(), config=ds_config)
data = torch.Generator().manual_seed(1000 + engine.global_rank)  # each rank its own batches
for micro_step in range(20 * 4):  # 20 optimizer steps of 4 micro-batches
    x = torch.randn(16, 64, generator=data)
    y = 8 * torch.tanh(x[:, :16] + x[:, 16:32])
    loss = torch.nn.functional.mse_loss(engine(x.to(dtype)).float(), y)
    engine.backward(loss)
    engine.step()
engine.save_checkpoint(out_dir)  # with the fp32 master weights
if engine.global_rank == 0:
    state = {k: v.float() for k, v in engine.module.state_dict().items()}
    torch.save(state, os.path.join(out_dir, "module.pt"))
    print("step", engine.global_steps, "loss", loss.item(), "lr", lr_scheduler.get_last_lr())
engine.destroy()  # zerod: also waits until the checkpoint is on disk
