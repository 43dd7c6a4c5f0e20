#!/usr/bin/python3
"""Writes the training and held-out text from Jane Austen's novels.

Example:
    /usr/bin/python3 tools/train/prepare_data.py tools/train/data

The novels come from R's janeaustenr package (MIT licence; Debian package
r-cran-janeaustenr), exported with Rscript.  Persuasion is held out for
evaluation (heldout.txt); the other five novels form train.txt.

The package keeps Project Gutenberg's hard line wraps.  They are undone here:
each blank-line-separated paragraph becomes one line, whitespace runs become
one space (kvllm turns every space into its own "▁", so runs would only waste
tokens), and the underscores marking italics are dropped.  Paragraphs are
separated by a single "\n", which the tokenizer keeps as one token, so the
model learns to end paragraphs.
"""

import argparse
import os
import re
import subprocess

TRAIN_NOVELS = ["sensesensibility", "prideprejudice", "mansfieldpark", "emma",
                "northangerabbey"]
HELDOUT_NOVEL = "persuasion"

# Writes each novel named on the command line to OUTDIR/<name>.raw.txt.
R_EXPORT = """
args <- commandArgs(trailingOnly = TRUE)
library(janeaustenr)
for (name in args[-1]) {
  writeLines(get(name), file.path(args[1], paste0(name, ".raw.txt")),
             useBytes = TRUE)
}
"""


def reflow(raw):
    """One line per paragraph, single spaces, no italics underscores."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", raw):
        text = " ".join(block.replace("_", "").split())
        if text:
            paragraphs.append(text)
    return "\n".join(paragraphs) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("outdir", help="folder for train.txt and heldout.txt")
    args = p.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    novels = TRAIN_NOVELS + [HELDOUT_NOVEL]
    subprocess.run(["Rscript", "-e", R_EXPORT, args.outdir] + novels,
                   check=True)

    def read(name):
        path = os.path.join(args.outdir, name + ".raw.txt")
        with open(path, encoding="utf-8") as f:
            text = reflow(f.read())
        os.remove(path)
        return text

    outputs = {"train.txt": "".join(read(n) for n in TRAIN_NOVELS),
               "heldout.txt": read(HELDOUT_NOVEL)}
    for filename, text in outputs.items():
        with open(os.path.join(args.outdir, filename), "w",
                  encoding="utf-8") as f:
            f.write(text)
        print(f"prepare_data: {filename}: {len(text)} characters")


if __name__ == "__main__":
    main()
