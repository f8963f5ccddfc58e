from readouts.cli import main

main()
