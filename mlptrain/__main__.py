from mlptrain.cli import main

main()
