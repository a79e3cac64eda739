"""runner/config/redact.py: credentials in URIs and values of secret-looking environment variables never reach logs,
MLflow params or tags."""

import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.config.redact import MASK, is_secret_name, redact, redact_mapping, redact_uri


@pytest.fixture(autouse=True)
def no_secrets_of_this_machine(monkeypatch):
    """Only the secrets a test sets: this machine's own (CI tokens...) would mask parts of the expected texts."""
    for name in list(os.environ):
        if is_secret_name(name):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    "name", ["MLFLOW_TRACKING_TOKEN", "AWS_SECRET_ACCESS_KEY", "db_password", "PGPASSWD", "GOOGLE_CREDENTIALS", "Auth"]
)
def test_secret_looking_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["HOME", "TF_CONFIG", "MLFLOW_TRACKING_URI", "CUDA_VISIBLE_DEVICES", "SLURM_PROCID"])
def test_ordinary_names(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("http://alice:s3cret@mlflow:5000/api", "http://alice:***@mlflow:5000/api"),
        ("https://bob:p%40ss@host", "https://bob:***@host"),
        ("postgresql+psycopg2://u:pw@db:5432/mlflow", "postgresql+psycopg2://u:***@db:5432/mlflow"),
        # every URI in a longer text
        ("from http://a:x@h1 to https://b:y@h2 now", "from http://a:***@h1 to https://b:***@h2 now"),
        # a token as the whole user part, no password: the token itself is masked
        ("https://ghp_0123456789abcdef@mlflow.example.com", "https://***@mlflow.example.com"),
        # a query parameter named like a secret
        ("postgresql://db/mlflow?user=bob&password=s3cr3t", "postgresql://db/mlflow?user=bob&password=***"),
        ("https://h/api?access_token=ghp_abc&x=1", "https://h/api?access_token=***&x=1"),
        # a database password typed unencoded, as SQLAlchemy still reads it: with `/`, or with a second `@`
        ("postgresql://u:pa/ss@db/mlflow", "postgresql://u:***@db/mlflow"),
        ("mysql+pymysql://u:p@ss@db:3306/mlflow?x=1", "mysql+pymysql://u:***@db:3306/mlflow?x=1"),
        ("at postgresql://u:a/b@c@db. Then", "at postgresql://u:***@db. Then"),
    ],
)
def test_uri_credentials_are_masked(text, expected):
    assert redact_uri(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "sqlite:///mlflow.db?timeout=20",
        "http://127.0.0.1:5000",
        "http://host:5000/models/m@v2",
        "user@example.com",
        "no uri",
        "postgresql://db:5432/mlflow?user=a@b",
        "sqlite:////data/m@1/mlflow.db",
    ],
)
def test_text_without_uri_credentials_is_unchanged(text):
    assert redact_uri(text) == text


def test_values_of_secret_variables_are_masked_anywhere(monkeypatch):
    monkeypatch.setenv("RUNNER_TEST_API_TOKEN", "tok-0123456789")
    monkeypatch.setenv("RUNNER_TEST_HOME", "/home/runner")  # not secret by its name: its value stays
    text = "sent tok-0123456789 to http://u:pw@h (header Bearer tok-0123456789) from /home/runner"
    assert redact(text) == "sent *** to http://u:***@h (header Bearer ***) from /home/runner"


def test_the_longest_secret_is_masked_first_and_short_values_are_left(monkeypatch):
    monkeypatch.setenv("RUNNER_TEST_A_KEY", "abcd")
    monkeypatch.setenv("RUNNER_TEST_B_KEY", "abcdefgh")
    monkeypatch.setenv("RUNNER_TEST_C_KEY", "xyz")  # under 4 characters: masking it would mask ordinary text
    assert redact("abcdefgh abcd xyz") == "*** *** xyz"


def test_redact_accepts_non_strings():
    assert redact_uri(42) == "42"


def test_mappings_mask_secret_keys_and_redact_every_other_value(monkeypatch):
    monkeypatch.setenv("RUNNER_TEST_SECRET", "hunter2-hunter2")
    tags = {
        "env.MY_PASSWORD": "anything at all",
        "mlflow.tracking_uri": "http://u:pw@host",
        "overrides": "data.path=/x/hunter2-hunter2.npz",
        "train.epochs": "2",
    }
    assert redact_mapping(tags) == {
        "env.MY_PASSWORD": MASK,
        "mlflow.tracking_uri": "http://u:***@host",
        "overrides": "data.path=/x/***.npz",
        "train.epochs": "2",
    }


def test_a_secret_word_in_a_key_prefix_does_not_mask_the_value():
    """Only the last part of a dotted key names the value: `auth.enabled` holds a flag, not a secret."""
    assert redact_mapping({"auth.enabled": "true", "server.auth": "s3cr3t!"}) == {"auth.enabled": "true", "server.auth": MASK}


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters="?#"), min_size=4, max_size=16))
def test_a_database_password_typed_unencoded_is_never_shown(password):
    """Whatever printable characters a password holds (`/`, `@`, `:` included), SQLAlchemy's reading or not."""
    uri = f"postgresql://alice:{password}@db.example:5432/mlflow"
    masked = redact_uri(f"could not connect to {uri} (timeout)")
    assert masked == "could not connect to postgresql://alice:***@db.example:5432/mlflow (timeout)", masked


@pytest.mark.parametrize("word", ["a" * 1_000_000, "a." * 500_000, "x://" + "a" * 1_000_000, "pg://u:" + "p@" * 200_000])
def test_redaction_is_linear_in_the_length_of_a_word(word):
    """A scheme was looked for from every letter of a word to its end: a 40 KB value took 1.7 s, 1 MB hung a run."""
    started = time.perf_counter()
    redact(word)
    assert time.perf_counter() - started < 1.0
