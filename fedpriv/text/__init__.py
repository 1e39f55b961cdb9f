"""The text pipeline's pieces: vocabulary layout, tokenizers (word, SentencePiece, Hugging Face)
and public corpora readers. Imports neither ``fedpriv.data`` nor ``fedpriv.public``; both use it."""
