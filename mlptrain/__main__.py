from mlptrain.cli import main

if __name__ == "__main__":  # `python -m mlptrain`; importing the module (tests/test_imports.py) runs nothing
    main()
