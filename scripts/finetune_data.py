"""The instruction set `make finetune` trains on: a name, and the greeting that addresses it.

usage: /usr/bin/python3 scripts/finetune_data.py OUT.jsonl

Each line is TRL's prompt-completion format: {"prompt": "Name: X\\nGreeting:", "completion":
" Good morning, X. How do you do?"}, over 1,397 names made of Austen's given names and
surnames, so that the model must copy the name it is given, which no novel taught it. The
names `make finetune` prompts with are not among them.
"""
import argparse
import json
import random

GIVEN = ["Emma", "Harriet", "Jane", "Elizabeth", "Mary", "Kitty", "Lydia", "Charlotte", "Anne",
         "Elinor", "Marianne", "Fanny", "Edmund", "Catherine", "Henry", "Eleanor", "Frederick",
         "Edward", "Robert", "Lucy", "Isabella", "John", "Thomas", "Maria", "Julia", "William",
         "George", "Charles", "Louisa", "Henrietta", "Sophia", "Caroline", "Georgiana",
         "Lady", "Sir", "Miss", "Mr.", "Mrs.", "Colonel", "Captain"]
SURNAMES = ["Woodhouse", "Knightley", "Bennet", "Darcy", "Bingley", "Wickham", "Collins",
            "Dashwood", "Ferrars", "Brandon", "Willoughby", "Steele", "Bertram", "Price",
            "Crawford", "Norris", "Morland", "Tilney", "Thorpe", "Elliot", "Wentworth",
            "Musgrove", "Russell", "Churchill", "Fairfax", "Weston", "Elton", "Martin",
            "Bates", "Lucas", "Gardiner", "Palmer", "Jennings", "Middleton", "Harville"]
HELD_OUT = {"Anne Darcy", "Colonel Woodhouse", "Miss Wentworth"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("out", help="the .jsonl file to write")
    out = parser.parse_args().out
    names = [f"{g} {s}" for g in GIVEN for s in SURNAMES if f"{g} {s}" not in HELD_OUT]
    random.Random(0).shuffle(names)
    with open(out, "w") as f:
        for name in names:
            f.write(json.dumps({"prompt": f"Name: {name}\nGreeting:",
                                "completion": f" Good morning, {name}. How do you do?"}) + "\n")
    print(f"{out}: {len(names)} examples")


if __name__ == "__main__":
    main()
