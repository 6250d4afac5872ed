"""What figures say they show: the model and the data of a run, in words, e.g.
"model tiny (2 layers x 4 heads, d_model 32), data induction".

Every stage that draws a figure titles it with these (scans, reports, findings). This one module of report/ is read by
the stages below it (ablation/ titles its figures with it): it needs nothing but the run directory contract.
"""

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from headcount.run_dir import read_pretrained


def describe_run(config: DictConfig, run_dir: str | Path | None = None) -> str:
    """What a figure says it shows: the model and the data, e.g.
    "model tiny (2 layers x 4 heads, d_model 32), data induction"."""
    return f"{describe_model(config, run_dir)}, {describe_data(config)}"


def describe_model(config: DictConfig, run_dir: str | Path | None = None) -> str:
    """The model's preset (where Hydra recorded the choice in the run's .hydra/hydra.yaml) and its shape."""
    m = config.model
    record = read_pretrained(run_dir) if run_dir is not None else None
    if record is not None:  # the run's config holds model.pretrained; the shape is the checkpoint's
        m = OmegaConf.create(record["model"])
    heads = m.get("heads_per_layer") or [m.attn.n_heads] * m.n_layers
    per_layer = f"{heads[0]} heads" if len(set(heads)) == 1 else f"{list(heads)} heads"
    shape = f"{m.n_layers} layers x {per_layer}, d_model {m.d_model}" + (", summed" if m.attn.combine == "sum" else "")
    hydra_file = Path(run_dir) / ".hydra" / "hydra.yaml" if run_dir is not None else None
    choices = OmegaConf.load(hydra_file).hydra.runtime.choices if hydra_file and hydra_file.exists() else {}
    if m.get("pretrained"):
        return f"model {Path(m.pretrained).name} ({shape})"
    return f"model {choices['model']} ({shape})" if "model" in choices else f"model {shape}"


def describe_data(config: DictConfig) -> str:
    """The data source, with the file or dataset it reads where it reads one."""
    d = config.data
    detail = {"text": Path(str(d.get("path"))).name, "hub": d.get("hub_name")}.get(d.source)
    return f"data {d.source}" + (f" {detail}" if detail else "")
